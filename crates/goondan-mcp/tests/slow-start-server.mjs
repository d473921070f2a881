// A stdio MCP server of an older revision (it knows `initialize`, not
// `server/discover`) that, on its first start only, reads nothing for
// 11 s: the client's SDK gives up on `server/discover` after 10 s and
// sends `initialize` on the same stream, so the late answer meets the
// wrong request. Its first argument is a flag file that marks the first
// start; every start is appended to it.
import { appendFileSync, existsSync } from "node:fs";
import { createInterface } from "node:readline";

const flag = process.argv[2];
const first = !existsSync(flag);
appendFileSync(flag, first ? "slow\n" : "fast\n");
const send = (message) => process.stdout.write(JSON.stringify({ jsonrpc: "2.0", ...message }) + "\n");
const serve = () => {
  const lines = createInterface({ input: process.stdin });
  lines.on("line", (line) => {
    const message = JSON.parse(line);
    if (message.id === undefined) return;
    switch (message.method) {
      case "initialize":
        send({
          id: message.id,
          result: {
            protocolVersion: message.params.protocolVersion,
            capabilities: { tools: {} },
            serverInfo: { name: "slow-start", version: "1.0.0" },
          },
        });
        break;
      case "tools/list":
        send({ id: message.id, result: { tools: [{ name: "ping", inputSchema: { type: "object" } }] } });
        break;
      default:
        send({ id: message.id, error: { code: -32601, message: `method not found: ${message.method}` } });
    }
  });
};
if (first) setTimeout(serve, 11_000);
else serve();
