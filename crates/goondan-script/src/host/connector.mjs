// The goondan connector host: runs one Connection's Connector entry
// (`export default async function run(ctx)`) for goondan-rs.
//
// Shipped inside the gdn binary and written to a private directory at start
// (the host's current directory). Frames are newline-delimited JSON over a
// socket gdn connected before starting the host: its end is the inherited
// file descriptor GOONDAN_CONNECTOR_FD names (transport.mjs, shared with the
// script host) — never stdout or stderr, which the connector may print to
// (gdn logs both). Config and secrets arrive in
// the `start` frame, never in argv or the environment.
//
// Lifetime: the host exits when its socket closes — the kernel closes gdn's
// end when gdn dies in any way, SIGKILL included (on Node also when stdin
// closes). Once run() has resolved, the socket no longer keeps the process
// alive: a connector whose run() started a server and returned keeps running
// on the server's handles, one with nothing left exits by itself (code 0).
import { isBun, openChannel } from './transport.mjs';

let format = (...args) => args.map((arg) => (typeof arg === 'string' ? arg : inspect(arg))).join(' ');
function inspect(value) {
  if (value instanceof Error) return value.stack ?? `${value.name}: ${value.message}`;
  try {
    return isBun ? Bun.inspect(value) : JSON.stringify(value);
  } catch {
    return String(value);
  }
}

function onFrame(frame) {
  if (frame.type === 'start') void start(frame);
  else if (frame.type === 'emitResult') answerEmit(frame);
  else if (frame.type === 'shutdown') shutdown();
}

// holdSocket: the socket keeps the process alive while run() runs or an
// emit waits for its answer, and not otherwise. exitWhenFlushed: a
// startError must reach gdn before the host exits.
const {
  send,
  hold: holdSocket,
  exitWhenFlushed,
} = await openChannel({ fdVariable: 'GOONDAN_CONNECTOR_FD', name: 'goondan connector host', onFrame });
import('node:util').then((util) => { format = util.format; }, () => {});

function isObject(value) {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function errorText(thrown) {
  if (thrown instanceof Error) return thrown.message;
  if (isObject(thrown) && typeof thrown.message === 'string') return thrown.message;
  return String(thrown);
}

class ConnectorEmitError extends Error {
  constructor(message, code) {
    super(message);
    this.name = 'ConnectorEmitError';
    this.code = code;
  }
}

// Emits waiting for Rust's answer, by rid.
const emits = new Map();
let nextRid = 1;
let returned = false;
let stopping = false;
let running = null;
const controller = new AbortController();

function settleHold() {
  holdSocket(!returned || emits.size > 0);
}

function emit(event, options) {
  if (options !== undefined && !isObject(options)) {
    return Promise.reject(new TypeError('ctx.emit(event, options): options must be an object such as {deliveryKey}'));
  }
  const deliveryKey = options?.deliveryKey;
  if (deliveryKey !== undefined && deliveryKey !== null && typeof deliveryKey !== 'string') {
    return Promise.reject(new TypeError('ctx.emit(event, {deliveryKey}): deliveryKey must be a string'));
  }
  let json;
  try {
    json = JSON.parse(JSON.stringify(event ?? null));
  } catch (error) {
    return Promise.reject(new TypeError(`ctx.emit: the event is not JSON: ${errorText(error)}`));
  }
  const rid = nextRid++;
  return new Promise((resolve, reject) => {
    emits.set(rid, { resolve, reject });
    settleHold();
    const frame = { type: 'emit', rid, event: json };
    if (typeof deliveryKey === 'string') frame.deliveryKey = deliveryKey;
    send(frame);
  });
}

function answerEmit(frame) {
  const waiting = emits.get(frame.rid);
  emits.delete(frame.rid);
  settleHold();
  if (stopping && returned) setTimeout(exitWhenIdle, 0);
  if (!waiting) return;
  if (frame.ok) waiting.resolve({ duplicate: frame.duplicate === true });
  else waiting.reject(new ConnectorEmitError(frame.error?.message ?? 'the event was not accepted', frame.error?.code ?? 'E_CONNECTOR_EMIT'));
}

function makeLogger() {
  const line = (level) => (...args) => send({ type: 'log', level, message: format(...args) });
  const logger = { debug: line('debug'), info: line('info'), warn: line('warn'), error: line('error') };
  logger.log = logger.info;
  return logger;
}

async function importEntry(path) {
  if (isBun) return import(path);
  const { pathToFileURL } = await import('node:url');
  return import(pathToFileURL(path).href);
}

// The original's shape: a default export function, possibly behind a
// module's own `default` (a CommonJS or transpiled module).
function findRun(namespace) {
  if (!isObject(namespace) && typeof namespace !== 'function') return undefined;
  if (typeof namespace.default === 'function') return namespace.default;
  if (isObject(namespace.default) && typeof namespace.default.default === 'function') return namespace.default.default;
  return undefined;
}

async function start(frame) {
  if (running) {
    send({ type: 'startError', message: 'this connector host already runs a connector' });
    return;
  }
  running = true;
  const ctx = {
    emit,
    config: Object.freeze({ ...(isObject(frame.config) ? frame.config : {}) }),
    secrets: Object.freeze({ ...(isObject(frame.secrets) ? frame.secrets : {}) }),
    logger: makeLogger(),
    connectionName: frame.connection,
    connectorName: frame.connector,
    signal: controller.signal,
  };
  let run;
  try {
    const namespace = await importEntry(frame.entry);
    run = findRun(namespace);
  } catch (error) {
    send({ type: 'startError', message: `cannot load the connector entry ${frame.entry}: ${errorText(error)}` });
    exitWhenFlushed(1);
    return;
  }
  if (typeof run !== 'function') {
    send({
      type: 'startError',
      message: `the connector entry ${frame.entry} has no default export function; export default async function run(ctx) { ... }`,
    });
    exitWhenFlushed(1);
    return;
  }
  let execution;
  try {
    execution = Promise.resolve(run(ctx));
  } catch (error) {
    execution = Promise.reject(error);
  }
  // The original's start-up probe: a run() that fails before the next
  // macrotask failed to start.
  const early = await Promise.race([
    execution.then(() => ({ state: 'returned' }), (error) => ({ state: 'failed', error })),
    new Promise((resolve) => setTimeout(() => resolve({ state: 'running' }), 0)),
  ]);
  if (early.state === 'failed') {
    send({ type: 'startError', message: `run() failed at start: ${errorText(early.error)}` });
    exitWhenFlushed(1);
    return;
  }
  send({ type: 'started' });
  execution.then(
    () => {
      send({ type: 'returned' });
      returned = true;
      if (stopping) exitWhenIdle();
      settleHold();
    },
    (error) => {
      if (stopping) process.exit(0);
      send({ type: 'failed', message: errorText(error), stack: error instanceof Error ? error.stack : undefined });
      exitWhenFlushed(1);
    },
  );
}

// Stop: ctx.signal aborts, and a connector written for the original (which
// stopped its connectors with SIGTERM) gets its SIGTERM/SIGINT handlers
// run. Emits already sent still get their answers (the event may be stored:
// its promise must say so). The host exits once run() has settled and no
// emit waits, or when nothing is left running; gdn kills it after its grace
// period otherwise.
function shutdown() {
  if (stopping) return;
  stopping = true;
  controller.abort(new Error('the connection is stopping'));
  if (process.listenerCount('SIGTERM') > 0) process.kill(process.pid, 'SIGTERM');
  else if (process.listenerCount('SIGINT') > 0) process.kill(process.pid, 'SIGINT');
  else if (returned || !running) exitWhenIdle();
}

function exitWhenIdle() {
  if (emits.size === 0) process.exit(0);
}
