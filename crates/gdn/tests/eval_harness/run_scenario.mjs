// Drives `gdn` the way the original Goondan's eval harness
// (`packages/eval/src/gdn-harness.ts`) does, step by step, and prints
// what it saw as one JSON object on standard output:
//
//   1. `gdn package install --state-root S` in the sample's directory;
//   2. `gdn run --foreground --state-root S` there (the global flag after
//      the subcommand);
//   3. once a line of its standard output or error matches
//      /\[goondan-orchestrator\] started/ (or 10 s went by), one JSON line
//      `{"name":"stdin_message","text":INPUT,"instanceKey":"eval-test"}`
//      on its standard input (the `cli` connector's message form);
//   4. every 500 ms: every `base.jsonl` under S, for a line whose
//      `data.role` (or `role`) is `assistant`, and every `.jsonl` under S,
//      for growth; once an answer was seen and neither the files nor the
//      process's output moved for the idle time (30 s in the harness),
//      SIGTERM (SIGKILL 5 s later); a hard timeout does the same;
//   5. every `runtime-events.jsonl` under S, each line an object with a
//      string `type`, and the answer's text from `data.content` (a string,
//      or its `text` parts).
//
// Written for this repository's tests from the harness's documented
// behaviour; it runs under Bun or Node. Arguments (environment):
//   GDN_BIN            the gdn binary
//   EVAL_SAMPLE_DIR    the bundle's directory (goondan.yaml)
//   EVAL_STATE_ROOT    the state root to use (made if missing)
//   EVAL_INPUT         the message
//   EVAL_IDLE_MS       idle time after the answer (default 30000, as the harness)
//   EVAL_TIMEOUT_MS    hard timeout (default 60000, as the harness)

import { execFile, spawn } from "node:child_process";
import * as fs from "node:fs/promises";
import * as path from "node:path";

const STARTED = /\[goondan-orchestrator\] started/;
const STARTUP_FALLBACK_MS = 10_000;
const POLL_MS = 500;

const gdn = process.env.GDN_BIN ?? "gdn";
const sampleDir = required("EVAL_SAMPLE_DIR");
const stateRoot = required("EVAL_STATE_ROOT");
const input = required("EVAL_INPUT");
const idleMs = Number(process.env.EVAL_IDLE_MS ?? 30_000);
const timeoutMs = Number(process.env.EVAL_TIMEOUT_MS ?? 60_000);

function required(name) {
  const value = process.env[name];
  if (value === undefined || value === "") {
    throw new Error(`${name} is not set`);
  }
  return value;
}

function isObject(value) {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** Every file named `name` (or, with `name` null, ending in .jsonl) under `dir`. */
async function findFiles(dir, name) {
  const found = [];
  async function walk(at) {
    let entries;
    try {
      entries = await fs.readdir(at, { withFileTypes: true });
    } catch {
      return;
    }
    for (const entry of entries) {
      const full = path.join(at, entry.name);
      if (entry.isDirectory()) {
        await walk(full);
      } else if (name === null ? entry.name.endsWith(".jsonl") : entry.name === name) {
        found.push(full);
      }
    }
  }
  await walk(dir);
  return found;
}

async function readText(file) {
  try {
    return await fs.readFile(file, "utf8");
  } catch {
    return "";
  }
}

/** The parsed non-blank lines of `file`; unparseable ones are skipped. */
async function jsonLines(file) {
  const parsed = [];
  for (const line of (await readText(file)).split("\n")) {
    if (line.trim() === "") continue;
    try {
      parsed.push(JSON.parse(line));
    } catch {
      // A line being written, or torn: the harness skips it too.
    }
  }
  return parsed;
}

function isAssistant(record) {
  if (!isObject(record)) return false;
  if (isObject(record.data) && record.data.role === "assistant") return true;
  return record.role === "assistant";
}

function answerText(record) {
  const data = isObject(record.data) ? record.data : record;
  if (isObject(data.message) && typeof data.message.text === "string") return data.message.text;
  if (typeof data.content === "string") return data.content;
  if (Array.isArray(data.content)) {
    const texts = data.content
      .filter((part) => isObject(part) && part.type === "text" && typeof part.text === "string")
      .map((part) => part.text);
    if (texts.length > 0) return texts.join("\n");
  }
  return undefined;
}

async function answers() {
  const texts = [];
  for (const file of await findFiles(stateRoot, "base.jsonl")) {
    for (const record of await jsonLines(file)) {
      if (isAssistant(record)) {
        const text = answerText(record);
        if (text) texts.push(text);
      }
    }
  }
  return texts;
}

async function jsonlLineCount() {
  let count = 0;
  for (const file of await findFiles(stateRoot, null)) {
    count += (await readText(file)).split("\n").filter((line) => line.trim() !== "").length;
  }
  return count;
}

function install() {
  return new Promise((resolve, reject) => {
    execFile(
      gdn,
      ["package", "install", "--state-root", stateRoot],
      { cwd: sampleDir, env: process.env, timeout: 30_000 },
      (error, stdout, stderr) => {
        if (error) reject(new Error(`gdn package install failed: ${stderr || error.message}`));
        else resolve({ stdout, stderr });
      },
    );
  });
}

function run() {
  return new Promise((resolve, reject) => {
    const child = spawn(gdn, ["run", "--foreground", "--state-root", stateRoot], {
      cwd: sampleDir,
      env: process.env,
      stdio: ["pipe", "pipe", "pipe"],
    });
    const seen = { stdout: "", stderr: "", startedLine: false, fallback: false, signalled: null };
    let sent = false;
    let settled = false;
    let poller;
    let lastOutput = Date.now();

    function onOutput(stream) {
      return (chunk) => {
        const text = chunk.toString();
        seen[stream] += text;
        lastOutput = Date.now();
        if (!sent && STARTED.test(text)) {
          seen.startedLine = true;
          send();
        }
      };
    }
    child.stdout.on("data", onOutput("stdout"));
    child.stderr.on("data", onOutput("stderr"));

    function stop(why) {
      if (settled || seen.signalled !== null) return;
      seen.signalled = why;
      child.kill("SIGTERM");
      setTimeout(() => {
        try {
          child.kill("SIGKILL");
        } catch {
          // Already gone.
        }
      }, 5_000);
    }

    function send() {
      if (sent || settled) return;
      sent = true;
      const line = JSON.stringify({ name: "stdin_message", text: input, instanceKey: "eval-test" });
      child.stdin.write(`${line}\n`, () => poll());
    }

    function poll() {
      let lines = 0;
      let answered = false;
      let lastActivity = Date.now();
      let busy = false;
      poller = setInterval(async () => {
        if (settled || busy) return;
        busy = true;
        try {
          const [texts, count] = await Promise.all([answers(), jsonlLineCount()]);
          if (count > lines) lastActivity = Date.now();
          lastActivity = Math.max(lastActivity, lastOutput);
          lines = count;
          answered ||= texts.length > 0;
          if (answered && Date.now() - lastActivity >= idleMs) {
            clearInterval(poller);
            stop("idle");
          }
        } finally {
          busy = false;
        }
      }, POLL_MS);
    }

    const fallback = setTimeout(() => {
      if (!sent) {
        seen.fallback = true;
        send();
      }
    }, STARTUP_FALLBACK_MS);
    const hard = setTimeout(() => {
      stop("timeout");
      setTimeout(() => finish(124), 6_000);
    }, timeoutMs);

    function finish(exitCode, signal = null) {
      if (settled) return;
      settled = true;
      clearTimeout(fallback);
      clearTimeout(hard);
      if (poller !== undefined) clearInterval(poller);
      resolve({ ...seen, exitCode, signal });
    }
    // As the harness: a process killed by a signal has no code, and counts as 1.
    child.on("close", (code, signal) => finish(code ?? 1, signal));
    child.on("error", (error) => {
      if (settled) return;
      settled = true;
      reject(new Error(`Failed to spawn gdn: ${error.message}`));
    });
  });
}

async function runtimeEvents() {
  const events = [];
  for (const file of await findFiles(stateRoot, "runtime-events.jsonl")) {
    for (const record of await jsonLines(file)) {
      if (isObject(record) && typeof record.type === "string") events.push(record);
    }
  }
  return events;
}

const started = Date.now();
await fs.mkdir(stateRoot, { recursive: true });
const installed = await install();
const ran = await run();
const result = {
  response: (await answers()).join("\n"),
  runtimeEvents: await runtimeEvents(),
  runtimeEventFiles: (await findFiles(stateRoot, "runtime-events.jsonl")).map((f) => path.relative(stateRoot, f)),
  baseFiles: (await findFiles(stateRoot, "base.jsonl")).map((f) => path.relative(stateRoot, f)),
  exitCode: ran.exitCode,
  signal: ran.signal,
  stoppedBy: ran.signalled,
  startedLine: ran.startedLine,
  fallback: ran.fallback,
  durationMs: Date.now() - started,
  installStderr: installed.stderr,
  stdout: ran.stdout,
  stderr: ran.stderr,
};
process.stdout.write(`${JSON.stringify(result)}\n`);
