// The goondan JavaScript host: runs a bundle's Tool modules and Extensions
// for goondan-rs.
//
// Shipped inside the gdn binary and written to a private directory at start
// (the host's current directory). Frames are newline-delimited JSON over a
// socket gdn connected before starting the host: its end is the inherited
// file descriptor GOONDAN_SCRIPT_FD names (transport.mjs, shared with the
// connector host). The host exits when that socket closes, so it never
// outlives gdn. Start-up is on the cold path of the first script call, so
// nothing but the transport next to it is imported statically: on Bun the
// socket, file checks and formatting use Bun's own APIs (importing node:net
// costs Bun 15-25 ms on these machines); Node loads its modules on demand.
import { isBun, openChannel } from './transport.mjs';

// Log lines are formatted like console.log; node:util's format takes over
// once loaded, in the background after start-up.
let format = (...args) => args.map((arg) => (typeof arg === 'string' ? arg : safeInspect(arg))).join(' ');
let inspect = (value) => safeInspect(value);
function safeInspect(value) {
  try {
    return isBun ? Bun.inspect(value) : JSON.stringify(value);
  } catch {
    return String(value);
  }
}

function onFrame(frame) {
  if (frame.type === 'call') {
    // Each call is its own task: calls of one step run concurrently.
    void runCall(frame, moduleHandler);
  } else if (frame.type === 'extensionCall') {
    void runCall(frame, extensionToolHandler);
  } else if (frame.type === 'middleware') {
    void runMiddleware(frame);
  } else if (frame.type === 'nextResult') {
    sessions.get(frame.id)?.answer(frame);
  } else if (frame.type === 'stateResult' || frame.type === 'taskResult') {
    const waiting = hostRequests.get(frame.rid);
    hostRequests.delete(frame.rid);
    if (waiting) {
      if (frame.ok) waiting.resolve(frame.value ?? null);
      else {
        const error = new Error(frame.error ?? 'the request failed');
        if (typeof frame.code === 'string') error.code = frame.code;
        waiting.reject(error);
      }
    }
  } else if (frame.type === 'taskCancel') {
    const reason = new Error(`task ${frame.handle} was cancelled`);
    reason.name = 'AbortError';
    taskControllers.get(frame.handle)?.abort(reason);
  } else if (frame.type === 'loadExtension') {
    void runLoadExtension(frame);
  } else if (frame.type === 'inspect') {
    void runInspect(frame);
  } else if (frame.type === 'cancel') {
    if (inflight.has(frame.id)) cancelled.add(frame.id);
    sessions.get(frame.id)?.cancel();
    send({ type: 'cancelled', id: frame.id });
  }
}

const { send } = await openChannel({ fdVariable: 'GOONDAN_SCRIPT_FD', name: 'goondan host', onFrame });
// Not needed for the first call: load the full formatter afterwards.
import('node:util').then(
  (util) => {
    format = util.format;
    inspect = (value, options) => util.inspect(value, options);
  },
  () => {},
);

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

// A tool's ctx.logger (spec 002 §5.3: a Console) and an extension's
// api.logger: console's methods, each line a `log` frame at a level —
// log/info/dir/dirxml/table/count/timeLog/timeEnd/group labels at info,
// debug and trace (with its stack) at debug, warn, error and failed
// asserts at error — tagged with the call it belongs to. group indents the
// lines after it by two spaces, as console does. The methods need no
// `this`, so `const { log } = ctx.logger` works too.
const hostFile = (() => {
  try {
    return new URL(import.meta.url).pathname;
  } catch {
    return '\0';
  }
})();

function makeLogger(id, prefix) {
  let indent = '';
  const counts = new Map();
  const timers = new Map();
  const emit = (level, text) => {
    const body = indent ? text.split('\n').map((part) => indent + part).join('\n') : text;
    send({ type: 'log', level, message: prefix ? `${prefix} ${body}` : body, id });
  };
  const line = (level) => (...args) => emit(level, format(...args));
  const elapsed = (label) => {
    const ms = performance.now() - timers.get(label);
    return ms < 1000 ? `${ms.toFixed(3)}ms` : `${(ms / 1000).toFixed(3)}s`;
  };
  const timed = (method, label, after) => {
    const name = String(label);
    if (!timers.has(name)) {
      emit('warn', `No such label '${name}' for console.${method}()`);
      return;
    }
    const rest = after.length > 0 ? ` ${format(...after)}` : '';
    emit('info', `${name}: ${elapsed(name)}${rest}`);
    if (method === 'timeEnd') timers.delete(name);
  };
  const group = (...label) => {
    if (label.length > 0) emit('info', format(...label));
    indent += '  ';
  };
  const nothing = () => {};
  return {
    log: line('info'),
    info: line('info'),
    debug: line('debug'),
    warn: line('warn'),
    error: line('error'),
    trace: (...args) => {
      // The caller's frames: not this one, nor the host's own below it,
      // nor the JavaScript runtime's internals (Node's `node:internal/…`,
      // Bun's `native` frames), which say nothing about the tool.
      const frames = String(new Error().stack ?? '')
        .split('\n')
        .slice(2)
        .filter((frame) => !frame.includes(hostFile))
        .filter((frame) => !/\(?node:internal\/|\(native\)|\[native code\]/.test(frame))
        .join('\n');
      const head = args.length > 0 ? `Trace: ${format(...args)}` : 'Trace';
      emit('debug', frames ? `${head}\n${frames}` : head);
    },
    dir: (value, options) => {
      let text;
      try {
        text = inspect(value, options);
      } catch {
        text = String(value);
      }
      emit('info', text);
    },
    dirxml: line('info'),
    table: (data) => emit('info', format(data)),
    assert: (condition, ...args) => {
      if (!condition) emit('error', args.length > 0 ? `Assertion failed: ${format(...args)}` : 'Assertion failed');
    },
    count: (label = 'default') => {
      const name = String(label);
      const n = (counts.get(name) ?? 0) + 1;
      counts.set(name, n);
      emit('info', `${name}: ${n}`);
    },
    countReset: (label = 'default') => {
      const name = String(label);
      if (counts.has(name)) counts.set(name, 0);
      else emit('warn', `Count for '${name}' does not exist`);
    },
    group,
    groupCollapsed: group,
    groupEnd: () => {
      indent = indent.slice(0, -2);
    },
    time: (label = 'default') => {
      const name = String(label);
      if (timers.has(name)) emit('warn', `Label '${name}' already exists for console.time()`);
      else timers.set(name, performance.now());
    },
    timeLog: (label = 'default', ...data) => timed('timeLog', label, data),
    timeEnd: (label = 'default') => timed('timeEnd', label, []),
    timeStamp: nothing,
    profile: nothing,
    profileEnd: nothing,
  };
}

// ctx.runtime of a middleware layer: the agents API belongs to tools (and
// to layers as ctx.agents).
function unavailable(method) {
  return () =>
    Promise.reject(
      new Error(
        `ctx.runtime.${method}: a middleware layer has no ctx.runtime; use ctx.agents.request / ctx.agents.send`,
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

// ctx.runtime of a tool call: the original's AgentToolRuntime, answered by
// the agent process (through the orchestrator) for the call `callId`.
function toolRuntimeFor(callId) {
  const call = (method, params) => hostRequest({ call: callId, method, params: toJson(params) }, 'toolRuntime');
  return Object.freeze({
    request: (target, event, options) => call('request', { target, event: event ?? {}, options: options ?? {} }),
    send: (target, event) => call('send', { target, event: event ?? {} }),
    spawn: (target, options) => call('spawn', { target, options: options ?? {} }),
    list: (options) => call('list', { options: options ?? {} }),
    catalog: () => call('catalog', {}),
  });
}

// ctx.tasks of a tool call: pending results completed later (issue 23).
// start() opens a task in the agent instance's task book while the call
// runs; the tool returns pending(task, output?) — the `__async` object of
// spec 004 §6.3 — and calls task.complete(output) or task.fail(error)
// whenever its work ends, after the call returned too. task.signal aborts
// when the task is cancelled (a fail() after that ends it `cancelled`).
// complete(handle, output) / fail(handle, error) finish a task by handle:
// one started here, or one a tool of this host returned as a bare
// `{__async: true, handle}`. Every ctx.tasks reaches every such task, so a
// tool may keep its ctx (or a later call's) to finish them.
const taskControllers = new Map();

function failureReason(error) {
  if (isObject(error) || error instanceof Error) {
    const message = typeof error.message === 'string' ? error.message : String(error);
    const code = typeof error.code === 'string' || typeof error.code === 'number' ? String(error.code) : '';
    return code && !message.startsWith(code) ? `${code}: ${message}` : message;
  }
  return error === undefined ? '' : String(error);
}

function finishTask(method, handle, ok, value) {
  if (typeof handle !== 'string' || handle.length === 0) {
    return Promise.reject(new TypeError(`ctx.tasks.${method}: a task handle must be a non-empty string`));
  }
  const body = ok
    ? { op: 'finish', handle, ok: true, output: toJson(value) }
    : { op: 'finish', handle, ok: false, error: failureReason(value) };
  return hostRequest(body, 'task').then(
    (answer) => {
      taskControllers.delete(handle);
      return answer;
    },
    (error) => {
      if (error?.code === 'E_TASK_FINISHED') taskControllers.delete(handle);
      throw error;
    },
  );
}

function tasksApiFor(callId) {
  return Object.freeze({
    async start() {
      const { handle } = await hostRequest({ op: 'start', call: callId }, 'task');
      const controller = new AbortController();
      taskControllers.set(handle, controller);
      return Object.freeze({
        handle,
        signal: controller.signal,
        complete: (output) => finishTask('complete', handle, true, output),
        fail: (error) => finishTask('fail', handle, false, error),
      });
    },
    pending(task, output) {
      const handle = typeof task === 'string' ? task : task?.handle;
      if (typeof handle !== 'string' || handle.length === 0) {
        throw new TypeError('ctx.tasks.pending(task, output?): task must be a started task or its handle');
      }
      if (output !== undefined && output !== null && !isObject(output)) {
        throw new TypeError("ctx.tasks.pending(task, output?): output must be an object (its fields are the pending result's output)");
      }
      return { ...(output ?? {}), __async: true, handle };
    },
    complete: (handle, output) => finishTask('complete', handle, true, output),
    fail: (handle, error) => finishTask('fail', handle, false, error),
  });
}

async function importModule(modulePath) {
  try {
    return await loadModule(modulePath);
  } catch (error) {
    const why = error instanceof Error ? error.message : String(error);
    throw new HostError(`cannot load module ${modulePath}: ${why}`, 'E_SCRIPT_MODULE', 'ModuleError');
  }
}

// The names a call could run: the keys of the module's handlers (found as
// for a call) whose values are functions.
async function runInspect(frame) {
  const { id, module: modulePath } = frame;
  let reply;
  try {
    const namespace = await importModule(modulePath);
    let names;
    if (frame.kind === 'extension') {
      names = typeof findRegister(namespace) === 'function' ? ['register'] : [];
    } else {
      const handlers = readHandlers(namespace);
      names = handlers ? Object.keys(handlers).filter((name) => typeof handlers[name] === 'function') : [];
    }
    reply = { type: 'exports', id, ok: true, names };
  } catch (thrown) {
    reply = { type: 'exports', id, ok: false, error: errorBody(thrown) };
  }
  send(reply);
}

// The handler of a Tool module's export.
async function moduleHandler(frame) {
  const { module: modulePath, export: exportName } = frame;
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
  return handler;
}

// The handler of a tool an extension registered.
async function extensionToolHandler(frame) {
  const registered = extensionTools.get(frame.tool);
  if (!registered) {
    throw new HostError(`no extension registered a tool named '${frame.tool}' in this host`, 'E_TOOL_NOT_FOUND', 'ToolNotFoundError');
  }
  return registered.handler;
}

async function runCall(frame, findHandler) {
  const { id } = frame;
  inflight.add(id);
  let reply;
  try {
    const handler = await findHandler(frame);
    const ctx = {
      ...frame.ctx,
      message: toJsMessage(frame.ctx?.message),
      logger: makeLogger(id),
      runtime: toolRuntimeFor(id),
      tasks: tasksApiFor(id),
    };
    const output = await handler(ctx, frame.input ?? {});
    reply = { type: 'result', id, ok: true, output: toJson(output) };
  } catch (thrown) {
    reply = { type: 'result', id, ok: false, error: errorBody(thrown) };
  }
  inflight.delete(id);
  if (cancelled.delete(id)) return;
  send(reply);
}

// ---------------------------------------------------------------------------
// Extensions: register(api, config), middleware and extension tools.
// ---------------------------------------------------------------------------

// Extension name → what its register() registered.
const extensions = new Map();
// Tool name → { extension, handler } for api.tools.register.
const extensionTools = new Map();
// api.events: one bus shared by the agent's extensions, as in the original.
const bus = new Map();
// Middleware id → its session (answers to next()).
const sessions = new Map();
// The host's own requests (api.state) by rid.
const hostRequests = new Map();
let nextRid = 1;

const PIPELINES = ['turn', 'step', 'toolCall'];

function hostRequest(body, type = 'state') {
  const rid = nextRid++;
  return new Promise((resolve, reject) => {
    hostRequests.set(rid, { resolve, reject });
    send({ type, rid, ...body });
  });
}

// The `register` of an extension module: a named export, or a default
// export's (itself possibly a function module or holding a default).
function findRegister(namespace) {
  if (!isObject(namespace) && typeof namespace !== 'function') return undefined;
  if (typeof namespace.register === 'function') return namespace.register.bind(namespace);
  if ('default' in namespace && namespace.default !== namespace) return findRegister(namespace.default);
  return undefined;
}

function makeExtensionApi(record) {
  const logger = makeLogger(undefined, `[${record.name}]`);
  return {
    pipeline: {
      register(type, fn, options) {
        if (!PIPELINES.includes(type)) {
          throw new TypeError(`api.pipeline.register: unknown pipeline '${type}' (expected 'turn', 'step' or 'toolCall')`);
        }
        if (typeof fn !== 'function') throw new TypeError('api.pipeline.register: the middleware must be a function');
        const priority = options?.priority ?? 0;
        if (!Number.isSafeInteger(priority)) throw new TypeError('api.pipeline.register: options.priority must be an integer');
        if (!record.loading) {
          throw new Error(
            `api.pipeline.register('${type}') after register() returned: goondan-rs builds the pipelines when the agent starts; register middleware inside register()`,
          );
        }
        const list = record.middleware[type];
        record.decls.push({ pipeline: type, priority, index: list.length });
        list.push(fn);
      },
    },
    tools: {
      register(item, handler) {
        if (!isObject(item) || typeof item.name !== 'string' || item.name.length === 0) {
          throw new TypeError('api.tools.register: the item needs a non-empty string `name`');
        }
        if (typeof handler !== 'function') throw new TypeError(`api.tools.register('${item.name}'): the handler must be a function`);
        const owner = extensionTools.get(item.name);
        if (owner && owner.extension !== record.name) {
          throw new Error(`api.tools.register: extension '${owner.extension}' already registered a tool named '${item.name}'`);
        }
        extensionTools.set(item.name, { extension: record.name, handler });
        const tool = { name: item.name, source: { type: 'extension', name: record.name } };
        if (typeof item.description === 'string') tool.description = item.description;
        if (isObject(item.parameters)) tool.parameters = toJson(item.parameters);
        if (record.loading) record.tools.push(tool);
        else send({ type: 'registerTool', extension: record.name, item: tool });
      },
    },
    state: {
      get: () => hostRequest({ op: 'get', extension: record.name }),
      set: (value) => hostRequest({ op: 'set', extension: record.name, value: toJson(value) }),
    },
    events: {
      on(event, handler) {
        if (typeof handler !== 'function') throw new TypeError('api.events.on: the handler must be a function');
        let handlers = bus.get(event);
        if (!handlers) bus.set(event, (handlers = new Set()));
        handlers.add(handler);
        return () => handlers.delete(handler);
      },
      emit(event, ...args) {
        for (const handler of [...(bus.get(event) ?? [])]) {
          try {
            const returned = handler(...args);
            if (returned && typeof returned.catch === 'function') {
              returned.catch((error) => logger.error(`api.events handler for '${event}' failed:`, error));
            }
          } catch (error) {
            logger.error(`api.events handler for '${event}' failed:`, error);
          }
        }
        return Promise.resolve();
      },
    },
    logger,
  };
}

async function runLoadExtension(frame) {
  const { id, name, module: modulePath } = frame;
  const record = { name, loading: true, middleware: { turn: [], step: [], toolCall: [] }, decls: [], tools: [] };
  extensions.set(name, record);
  let reply;
  try {
    let namespace;
    try {
      namespace = await loadModule(modulePath);
    } catch (error) {
      const why = error instanceof Error ? error.message : String(error);
      throw new HostError(`cannot load extension module ${modulePath}: ${why}`, 'E_EXT_LOAD', 'ExtensionLoadError');
    }
    const register = findRegister(namespace);
    if (typeof register !== 'function') {
      throw new HostError(
        `extension module ${modulePath} does not export a register function; export function register(api) { ... }`,
        'E_EXT_LOAD',
        'ExtensionLoadError',
      );
    }
    try {
      await register(makeExtensionApi(record), frame.config ?? {});
    } catch (error) {
      const why = error instanceof Error ? error.message : String(error);
      throw new HostError(`register() of extension '${name}' threw: ${why}`, 'E_EXT_INIT', 'ExtensionInitError');
    }
    record.loading = false;
    reply = { type: 'extension', id, ok: true, middleware: record.decls, tools: record.tools };
  } catch (thrown) {
    extensions.delete(name);
    for (const [tool, owner] of extensionTools) if (owner.extension === name) extensionTools.delete(tool);
    reply = { type: 'extension', id, ok: false, error: errorBody(thrown) };
  }
  send(reply);
}

// Messages travel with createdAt in milliseconds; extensions see a Date, as
// in the original.
function toJsMessage(message) {
  if (!isObject(message)) return message;
  const copy = { ...message, data: isObject(message.data) ? { ...message.data } : message.data };
  copy.metadata = isObject(message.metadata) ? { ...message.metadata } : {};
  if (typeof message.createdAt === 'number') copy.createdAt = new Date(message.createdAt);
  return copy;
}

function toJsEvent(event) {
  if (!isObject(event)) return event;
  return 'message' in event ? { ...event, message: toJsMessage(event.message) } : { ...event };
}

// The original's fold: events whose target is missing are skipped.
function foldEvents(base, events) {
  let current = base.slice();
  for (const event of events) {
    if (!isObject(event)) continue;
    if (event.type === 'append') current.push(event.message);
    else if (event.type === 'replace') {
      const at = current.findIndex((m) => m?.id === event.targetId);
      if (at >= 0) current[at] = event.message;
    } else if (event.type === 'remove') {
      const at = current.findIndex((m) => m?.id === event.targetId);
      if (at >= 0) current.splice(at, 1);
    } else if (event.type === 'truncate') current = [];
  }
  return current;
}

// ctx.agents of a turn or step layer: requests to the swarm's other agents,
// made by the agent process (through the orchestrator) for the layer's turn.
function agentsApiFor(turnId, traceId) {
  const call = (method) => (params) =>
    hostRequest({ method, params: toJson(params ?? {}), turnId, traceId }, 'agents');
  return Object.freeze({ request: call('request'), send: call('send') });
}

function stringify(value) {
  try {
    return JSON.stringify(value);
  } catch {
    return undefined;
  }
}

function toJsResult(pipeline, result) {
  if (pipeline === 'turn' && isObject(result) && result.responseMessage) {
    return { ...result, responseMessage: toJsMessage(result.responseMessage) };
  }
  return result;
}

// One running layer: the context it sees (backed by one shared state, so
// what inner layers change shows after next()), and its side of the
// next()/nextResult exchange.
function makeSession(frame) {
  const { id, pipeline } = frame;
  const raw = isObject(frame.ctx) ? frame.ctx : {};
  const conversation = isObject(raw.conversation) ? raw.conversation : {};
  const state = {
    base: Array.isArray(conversation.base) ? conversation.base.map(toJsMessage) : [],
    events: Array.isArray(conversation.events) ? conversation.events.map(toJsEvent) : [],
    pending: [],
    metadata: isObject(raw.metadata) ? raw.metadata : {},
    toolCatalog: Array.isArray(raw.toolCatalog) ? raw.toolCatalog : [],
    catalogJson: undefined,
    args: isObject(raw.args) ? raw.args : {},
  };
  state.catalogJson = stringify(state.toolCatalog);
  let waiting = null;
  let last = undefined;

  const conversationState = {
    get baseMessages() {
      return state.base;
    },
    get events() {
      return state.events;
    },
    get nextMessages() {
      return foldEvents(state.base, state.events);
    },
    toLlmMessages() {
      return foldEvents(state.base, state.events).map((message) => message?.data);
    },
  };
  const emitMessageEvent = (event) => {
    if (!isObject(event) || typeof event.type !== 'string') {
      throw new TypeError('emitMessageEvent: the event must be an object with a `type`');
    }
    state.events.push(event);
    state.pending.push(event);
  };
  const changes = () => {
    const out = { events: state.pending.splice(0).map(toJson), metadata: toJson(state.metadata) };
    if (pipeline === 'step') {
      const now = stringify(state.toolCatalog);
      out.toolCatalog = now === state.catalogJson ? null : toJson(state.toolCatalog);
    }
    if (pipeline === 'toolCall') out.args = toJson(state.args);
    return out;
  };
  const next = async () => {
    if (waiting) throw new Error('ctx.next() is already running; await it before calling it again');
    send({ type: 'next', id, ctx: changes() });
    const answer = await new Promise((resolve, reject) => {
      waiting = { resolve, reject };
    });
    const after = isObject(answer.ctx) ? answer.ctx : {};
    if (Array.isArray(after.events)) state.events = after.events.map(toJsEvent);
    if (isObject(after.metadata)) state.metadata = after.metadata;
    if (Array.isArray(after.toolCatalog)) {
      state.toolCatalog = after.toolCatalog;
      state.catalogJson = stringify(state.toolCatalog);
    }
    if (isObject(after.args)) state.args = after.args;
    const value = toJsResult(pipeline, answer.result);
    last = { value, json: stringify(value) };
    return value;
  };

  const base = {
    agentName: raw.agentName,
    instanceKey: raw.instanceKey,
    turnId: raw.turnId,
    traceId: raw.traceId,
  };
  let ctx;
  if (pipeline === 'toolCall') {
    ctx = {
      ...base,
      stepIndex: raw.stepIndex,
      toolName: raw.toolName,
      toolCallId: raw.toolCallId,
      runtime: runtimeApi,
      get args() {
        return state.args;
      },
      set args(value) {
        state.args = value;
      },
      get metadata() {
        return state.metadata;
      },
      set metadata(value) {
        state.metadata = value;
      },
      next,
    };
  } else {
    const inputEvent = isObject(raw.inputEvent) ? { ...raw.inputEvent } : {};
    if (typeof inputEvent.createdAt === 'number') inputEvent.createdAt = new Date(inputEvent.createdAt);
    ctx = {
      ...base,
      inputEvent,
      conversationState,
      agents: agentsApiFor(raw.turnId, raw.traceId),
      runtime: runtimeApi,
      emitMessageEvent,
      get metadata() {
        return state.metadata;
      },
      set metadata(value) {
        state.metadata = value;
      },
      next,
    };
    if (pipeline === 'step') {
      ctx.stepIndex = raw.stepIndex;
      ctx.turn = {
        id: raw.turnId,
        agentName: raw.agentName,
        inputEvent,
        get messages() {
          return foldEvents(state.base, state.events);
        },
        steps: [],
        status: 'running',
        metadata: {},
      };
      Object.defineProperty(ctx, 'toolCatalog', {
        get: () => state.toolCatalog,
        set: (value) => {
          state.toolCatalog = value;
        },
        enumerable: true,
      });
    }
  }

  return {
    ctx,
    changes,
    // Whether `result` is what the last next() resolved to, untouched.
    unchanged(result) {
      return last !== undefined && result === last.value && stringify(result) === last.json;
    },
    answer(frame) {
      const resolve = waiting?.resolve;
      waiting = null;
      resolve?.(frame);
    },
    cancel() {
      const reject = waiting?.reject;
      waiting = null;
      reject?.(new Error('the caller gave up on this middleware (the call timed out or the turn was cancelled)'));
    },
  };
}

async function runMiddleware(frame) {
  const { id, pipeline, extension, index } = frame;
  const fn = extensions.get(extension)?.middleware[pipeline]?.[index];
  if (typeof fn !== 'function') {
    send({
      type: 'done',
      id,
      ok: false,
      error: { message: `the script host has no ${pipeline} middleware #${index} of extension '${extension}'` },
    });
    return;
  }
  const session = makeSession(frame);
  sessions.set(id, session);
  inflight.add(id);
  let reply;
  try {
    const result = await fn(session.ctx);
    const unchanged = session.unchanged(result);
    reply = { type: 'done', id, ok: true, unchanged, result: unchanged ? null : toJson(result), ctx: session.changes() };
  } catch (thrown) {
    reply = { type: 'done', id, ok: false, error: errorBody(thrown) };
  }
  sessions.delete(id);
  inflight.delete(id);
  if (cancelled.delete(id)) return;
  send(reply);
}
