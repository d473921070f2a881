// A minimal MCP server over stdio for the client's own tests, so they can
// make a server fail on purpose: `echo` answers with its process id, `die`
// exits in the middle of its call, `fail` answers with `isError`. With
// FAKE_MCP_GATE set, it exits at once unless that file exists (a server
// that cannot start again).
import { existsSync } from 'node:fs';
import { createInterface } from 'node:readline';

if (process.env.FAKE_MCP_GATE && !existsSync(process.env.FAKE_MCP_GATE)) {
  process.stderr.write('the gate is closed\n');
  process.exit(4);
}

const send = (message) => process.stdout.write(JSON.stringify({ jsonrpc: '2.0', ...message }) + '\n');

createInterface({ input: process.stdin }).on('line', (line) => {
  let message;
  try {
    message = JSON.parse(line);
  } catch {
    return;
  }
  if (message.id === undefined) return; // a notification
  const { id, method, params } = message;
  if (method === 'initialize') {
    send({
      id,
      result: {
        protocolVersion: params.protocolVersion,
        capabilities: { tools: {} },
        serverInfo: { name: 'fake', version: '1.0.0' },
      },
    });
  } else if (method === 'tools/list') {
    send({
      id,
      result: {
        tools: [
          { name: 'echo', description: 'Echo a text.', inputSchema: { type: 'object', properties: { text: { type: 'string' } } } },
          { name: 'die', inputSchema: { type: 'object' } },
          { name: 'fail', inputSchema: { type: 'object' } },
        ],
      },
    });
  } else if (method === 'tools/call' && params.name === 'die') {
    process.exit(3);
  } else if (method === 'tools/call' && params.name === 'fail') {
    send({ id, result: { content: [{ type: 'text', text: 'it broke' }], isError: true } });
  } else if (method === 'tools/call') {
    send({ id, result: { content: [{ type: 'text', text: `${params.arguments?.text} from ${process.pid}` }] } });
  } else {
    send({ id, error: { code: -32601, message: `no method ${method}` } });
  }
});
