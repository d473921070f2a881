// The goondan JavaScript host: runs a bundle's Tool modules for goondan-rs.
//
// Shipped inside the gdn binary and written to a private directory at start.
// Frames are newline-delimited JSON over the Unix socket named by
// GOONDAN_SCRIPT_SOCKET — never stdout, which user code may print to (gdn
// logs stdout and stderr). The host exits when the socket closes (on Node
// also when stdin does), so it never outlives gdn.
// Start-up is on the cold path of the first script call, so nothing is
// imported statically: on Bun the socket, file checks and formatting use
// Bun's own APIs (importing node:net, or touching process.stdin, costs Bun
// 15-25 ms each on these machines); Node loads its modules on demand.
const isBun = typeof Bun !== 'undefined';

const socketPath = process.env.GOONDAN_SCRIPT_SOCKET;
if (!socketPath) {
  process.stderr.write('goondan host: GOONDAN_SCRIPT_SOCKET is not set\n');
  process.exit(2);
}

// Log lines are formatted like console.log; node:util's format takes over
// once loaded, in the background after start-up.
let format = (...args) => args.map((arg) => (typeof arg === 'string' ? arg : safeInspect(arg))).join(' ');
function safeInspect(value) {
  try {
    return isBun ? Bun.inspect(value) : JSON.stringify(value);
  } catch {
    return String(value);
  }
}

let buffered = '';
function onData(chunk) {
  buffered += chunk;
  let newline;
  while ((newline = buffered.indexOf('\n')) >= 0) {
    const line = buffered.slice(0, newline);
    buffered = buffered.slice(newline + 1);
    if (line.length === 0) continue;
    let frame;
    try {
      frame = JSON.parse(line);
    } catch (error) {
      send({ type: 'log', level: 'error', message: `goondan host: unreadable frame: ${String(error)}` });
      continue;
    }
    if (frame.type === 'call') {
      // Each call is its own task: calls of one step run concurrently.
      void runCall(frame);
    } else if (frame.type === 'inspect') {
      void runInspect(frame);
    } else if (frame.type === 'cancel') {
      if (inflight.has(frame.id)) cancelled.add(frame.id);
      send({ type: 'cancelled', id: frame.id });
    }
  }
}

function sendReady() {
  send({ type: 'ready', runtime: isBun ? 'bun' : 'node', version: isBun ? Bun.version : process.versions.node });
  // Not needed for the first call: load the full formatter afterwards.
  import('node:util').then((util) => { format = util.format; }, () => {});
}

// The host exits when its socket closes: the kernel closes it when gdn dies
// in any way, SIGKILL included, so the host never outlives gdn.
let write;
if (isBun) {
  const decoder = new TextDecoder();
  const encoder = new TextEncoder();
  // Bun's socket.write may take part of a large frame: the rest waits here
  // and goes out, in order, when the socket drains.
  let pending = null;
  let socket = null;
  const flush = () => {
    while (pending) {
      const written = socket.write(pending);
      if (written >= pending.length) {
        pending = null;
      } else {
        pending = pending.subarray(Math.max(written, 0));
        return;
      }
    }
  };
  socket = await Bun.connect({
    unix: socketPath,
    socket: {
      data(_socket, bytes) { onData(decoder.decode(bytes, { stream: true })); },
      drain() { flush(); },
      close() { process.exit(0); },
      error() { process.exit(0); },
      end() { process.exit(0); },
    },
  }).catch(() => process.exit(0));
  write = (text) => {
    const bytes = encoder.encode(text);
    if (pending) {
      const joined = new Uint8Array(pending.length + bytes.length);
      joined.set(pending);
      joined.set(bytes, pending.length);
      pending = joined;
      return;
    }
    const written = socket.write(bytes);
    if (written < bytes.length) pending = bytes.subarray(Math.max(written, 0));
  };
  sendReady();
} else {
  const net = (await import('node:net')).default;
  const socket = net.createConnection(socketPath);
  socket.setNoDelay?.(true);
  socket.on('error', () => process.exit(0));
  socket.on('close', () => process.exit(0));
  process.stdin.on('end', () => process.exit(0));
  process.stdin.on('error', () => process.exit(0));
  process.stdin.resume();
  write = (text) => socket.write(text);
  socket.setEncoding('utf8');
  socket.on('data', onData);
  socket.on('connect', sendReady);
}

function send(frame) {
  write(JSON.stringify(frame) + '\n');
}

// Ids of calls running now, and of those whose caller gave up (their
// eventual result is dropped).
const inflight = new Set();
const cancelled = new Set();
// Module path → the promise of its namespace: each module is imported once.
const modules = new Map();

class HostError extends Error {
  constructor(message, code, name) {
    super(message);
    this.name = name ?? 'Error';
    this.code = code;
  }
}

async function exists(path) {
  if (isBun) return Bun.file(path).exists();
  const fs = await import('node:fs');
  return fs.existsSync(path);
}

async function resolveEntry(path) {
  // As the original loader: a missing .ts may exist as .js and the other way round.
  if (await exists(path)) return path;
  for (const [from, to] of [['.ts', '.js'], ['.js', '.ts']]) {
    if (path.endsWith(from)) {
      const other = path.slice(0, -from.length) + to;
      if (await exists(other)) return other;
    }
  }
  return path;
}

async function importEntry(path) {
  const resolved = await resolveEntry(path);
  if (isBun) return import(resolved);
  const { pathToFileURL } = await import('node:url');
  return import(pathToFileURL(resolved).href);
}

function loadModule(path) {
  let loading = modules.get(path);
  if (!loading) {
    loading = importEntry(path);
    modules.set(path, loading);
    // A failed import is retried on the next call (the file may be fixed).
    loading.catch(() => modules.delete(path));
  }
  return loading;
}

function isObject(value) {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

// The shapes the original accepts: `export const handlers = {...}`, or a
// default export (itself possibly holding a default) with `handlers`.
function readHandlers(namespace) {
  if (!isObject(namespace)) return undefined;
  if ('handlers' in namespace && isObject(namespace.handlers)) return namespace.handlers;
  if ('default' in namespace && isObject(namespace.default)) return readHandlers(namespace.default);
  return undefined;
}

function toJson(value) {
  if (value === null || value === undefined) return null;
  switch (typeof value) {
    case 'string':
    case 'boolean':
      return value;
    case 'number':
      return Number.isFinite(value) ? value : String(value);
    case 'object':
      if (Array.isArray(value)) return value.map(toJson);
      if (typeof value.toJSON === 'function') return toJson(value.toJSON());
      return Object.fromEntries(Object.entries(value).map(([key, nested]) => [key, toJson(nested)]));
    default:
      return String(value);
  }
}

function errorBody(thrown) {
  if (!isObject(thrown) && typeof thrown !== 'function') {
    return { message: String(thrown) };
  }
  const body = { message: typeof thrown.message === 'string' ? thrown.message : String(thrown) };
  if (typeof thrown.name === 'string') body.name = thrown.name;
  if (typeof thrown.code === 'string' || typeof thrown.code === 'number') body.code = String(thrown.code);
  if (typeof thrown.suggestion === 'string') body.suggestion = thrown.suggestion;
  if (typeof thrown.helpUrl === 'string') body.helpUrl = thrown.helpUrl;
  return body;
}

function makeLogger(id) {
  const line = (level) => (...args) => send({ type: 'log', level, message: format(...args), id });
  return { debug: line('debug'), info: line('info'), warn: line('warn'), error: line('error') };
}

function unavailable(method) {
  return () =>
    Promise.reject(
      new Error(
        `ctx.runtime.${method}: the agents API needs the orchestrator, which this build of goondan-rs does not run yet`,
      ),
    );
}

const runtimeApi = Object.freeze({
  request: unavailable('request'),
  send: unavailable('send'),
  spawn: unavailable('spawn'),
  list: unavailable('list'),
  catalog: unavailable('catalog'),
});

async function importModule(modulePath) {
  try {
    return await loadModule(modulePath);
  } catch (error) {
    const why = error instanceof Error ? error.message : String(error);
    throw new HostError(`cannot load tool module ${modulePath}: ${why}`, 'E_SCRIPT_MODULE', 'ModuleError');
  }
}

// The names a call could run: the keys of the module's handlers (found as
// for a call) whose values are functions.
async function runInspect(frame) {
  const { id, module: modulePath } = frame;
  let reply;
  try {
    const handlers = readHandlers(await importModule(modulePath));
    const names = handlers ? Object.keys(handlers).filter((name) => typeof handlers[name] === 'function') : [];
    reply = { type: 'exports', id, ok: true, names };
  } catch (thrown) {
    reply = { type: 'exports', id, ok: false, error: errorBody(thrown) };
  }
  send(reply);
}

async function runCall(frame) {
  const { id, module: modulePath, export: exportName } = frame;
  inflight.add(id);
  let reply;
  try {
    const namespace = await importModule(modulePath);
    const handlers = readHandlers(namespace);
    const handler = handlers?.[exportName];
    if (typeof handler !== 'function') {
      const found = handlers ? `its handlers are: ${Object.keys(handlers).join(', ') || 'none'}` : 'it has no `handlers` export';
      throw new HostError(
        `tool module ${modulePath} has no handler for export '${exportName}' (${found}); ` +
          `export const handlers = { ${exportName}: (ctx, input) => ... }`,
        'E_SCRIPT_EXPORT_MISSING',
        'ExportMissingError',
      );
    }
    const ctx = { ...frame.ctx, logger: makeLogger(id), runtime: runtimeApi };
    const output = await handler(ctx, frame.input ?? {});
    reply = { type: 'result', id, ok: true, output: toJson(output) };
  } catch (thrown) {
    reply = { type: 'result', id, ok: false, error: errorBody(thrown) };
  }
  inflight.delete(id);
  if (cancelled.delete(id)) return;
  send(reply);
}
