// A minimal MCP server over stdio for the client's own tests, so they can
// make a server fail on purpose: `echo` answers with its process id, `die`
// exits in the middle of its call, `fail` answers with `isError`, `hang`
// never answers (and writes the reason of a `notifications/cancelled` for
// it to FAKE_MCP_CANCELLED), `progress` reports three steps of progress on
// the request's token before answering, and `add_tool` adds a tool `extra`
// and says so with `notifications/tools/list_changed`, `huge` (unlisted,
// so the listing tests see the same tools) answers with a text of
// `arguments.mib` MiB (one line over the client's limit). With FAKE_MCP_GATE
// set, it exits at once unless that file exists (a server that cannot start
// again). With FAKE_MCP_META set, the `_meta` of every tools/call is
// appended to that file, a JSON line each (the trace context a client sends).
import { appendFileSync, existsSync, writeFileSync } from 'node:fs';
import { createInterface } from 'node:readline';

if (process.env.FAKE_MCP_GATE && !existsSync(process.env.FAKE_MCP_GATE)) {
  process.stderr.write('the gate is closed\n');
  process.exit(4);
}

const send = (message) => process.stdout.write(JSON.stringify({ jsonrpc: '2.0', ...message }) + '\n');
const tools = [
  { name: 'echo', description: 'Echo a text.', inputSchema: { type: 'object', properties: { text: { type: 'string' } } } },
  { name: 'die', inputSchema: { type: 'object' } },
  { name: 'fail', inputSchema: { type: 'object' } },
  { name: 'hang', inputSchema: { type: 'object' } },
  { name: 'progress', inputSchema: { type: 'object' } },
  { name: 'add_tool', inputSchema: { type: 'object' } },
];
const hanging = new Set();

createInterface({ input: process.stdin }).on('line', (line) => {
  let message;
  try {
    message = JSON.parse(line);
  } catch {
    return;
  }
  const { id, method, params } = message;
  if (method === 'tools/call' && process.env.FAKE_MCP_META) {
    appendFileSync(process.env.FAKE_MCP_META, JSON.stringify(params?._meta ?? null) + '\n');
  }
  if (id === undefined) {
    if (method === 'notifications/cancelled' && hanging.has(params?.requestId) && process.env.FAKE_MCP_CANCELLED) {
      writeFileSync(process.env.FAKE_MCP_CANCELLED, String(params.reason ?? ''));
    }
    return;
  }
  if (method === 'initialize') {
    send({
      id,
      result: {
        protocolVersion: params.protocolVersion,
        capabilities: { tools: { listChanged: true } },
        serverInfo: { name: 'fake', version: '1.0.0' },
      },
    });
  } else if (method === 'tools/list') {
    send({ id, result: { tools } });
  } else if (method === 'tools/call' && params.name === 'die') {
    process.exit(3);
  } else if (method === 'tools/call' && params.name === 'fail') {
    send({ id, result: { content: [{ type: 'text', text: 'it broke' }], isError: true } });
  } else if (method === 'tools/call' && params.name === 'hang') {
    hanging.add(id);
  } else if (method === 'tools/call' && params.name === 'progress') {
    const progressToken = params._meta?.progressToken;
    if (progressToken !== undefined) {
      for (let step = 1; step <= 3; step++) {
        send({ method: 'notifications/progress', params: { progressToken, progress: step, total: 3, message: `step ${step}` } });
      }
    }
    send({ id, result: { content: [{ type: 'text', text: progressToken === undefined ? 'no token' : 'done' }] } });
  } else if (method === 'tools/call' && params.name === 'add_tool') {
    if (!tools.some((tool) => tool.name === 'extra')) {
      tools.push({ name: 'extra', description: 'Added later.', inputSchema: { type: 'object' } });
    }
    send({ method: 'notifications/tools/list_changed' });
    send({ id, result: { content: [{ type: 'text', text: 'added' }] } });
  } else if (method === 'tools/call' && params.name === 'huge') {
    send({ id, result: { content: [{ type: 'text', text: 'h'.repeat((params.arguments?.mib ?? 20) * 1024 * 1024) }] } });
  } else if (method === 'tools/call') {
    send({ id, result: { content: [{ type: 'text', text: `${params.arguments?.text} from ${process.pid}` }] } });
  } else {
    send({ id, error: { code: -32601, message: `no method ${method}` } });
  }
});
