// The channel to gdn of both JavaScript hosts: host.mjs (a bundle's Tool
// modules and Extensions) and connector.mjs (a Connection's Connector).
//
// Shipped inside the gdn binary and written next to them in their private
// directory. Frames are newline-delimited JSON over a socket gdn connected
// before starting the host: its end is the inherited file descriptor the
// host's variable names — never stdout or stderr, which user code may print
// to (gdn logs both).
//
// Lifetime: the host exits when the socket closes — the kernel closes gdn's
// end when gdn dies in any way, SIGKILL included (on Node also when stdin
// closes) — so a host never outlives gdn. Nothing here imports anything on
// Bun: Bun's own socket is used (importing node:net, or touching
// process.stdin, costs Bun 15-25 ms each), and Node loads node:net on demand.
export const isBun = typeof Bun !== 'undefined';

// Opens the channel on the descriptor `process.env[fdVariable]` names
// (exiting with code 2 when it names none), calls `onFrame` with each frame
// gdn sends, and says `ready`. `name` starts the host's own messages.
//
// Returns `send(frame)`; `hold(boolean)`, whether the socket keeps the
// process alive (it does until told otherwise); and `exitWhenFlushed(code)`,
// which exits once what was sent has left.
export async function openChannel({ fdVariable, name, onFrame }) {
  const channelFd = Number(process.env[fdVariable]);
  if (!Number.isInteger(channelFd) || channelFd < 3) {
    process.stderr.write(`${name}: ${fdVariable} does not name an inherited descriptor\n`);
    process.exit(2);
  }
  let write;
  const send = (frame) => write(JSON.stringify(frame) + '\n');

  let buffered = '';
  const onData = (chunk) => {
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
        send({ type: 'log', level: 'error', message: `${name}: unreadable frame: ${String(error)}` });
        continue;
      }
      onFrame(frame);
    }
  };

  let hold;
  let exitWhenFlushed;
  if (isBun) {
    const decoder = new TextDecoder();
    const encoder = new TextEncoder();
    // Bun's socket.write may take part of a large frame: the rest waits
    // here and goes out, in order, when the socket drains.
    let pending = null;
    let socket = null;
    let exitCode = null;
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
      if (exitCode !== null) process.exit(exitCode);
    };
    // Bun wraps the inherited, already connected socket as it would a new
    // one (ref and unref included).
    socket = await Bun.connect({
      fd: channelFd,
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
    hold = (keep) => (keep ? socket.ref() : socket.unref());
    exitWhenFlushed = (code) => {
      exitCode = code;
      hold(true);
      flush();
    };
  } else {
    const net = (await import('node:net')).default;
    const socket = new net.Socket({ fd: channelFd, readable: true, writable: true });
    socket.on('error', () => process.exit(0));
    socket.on('close', () => process.exit(0));
    process.stdin.on('end', () => process.exit(0));
    process.stdin.on('error', () => process.exit(0));
    process.stdin.resume();
    // Stdin only ends the host; what keeps it alive is the socket's to say.
    process.stdin.unref?.();
    write = (text) => socket.write(text);
    socket.setEncoding('utf8');
    socket.on('data', onData);
    hold = (keep) => (keep ? socket.ref() : socket.unref());
    exitWhenFlushed = (code) => socket.write('', () => process.exit(code));
  }
  send({ type: 'ready', runtime: isBun ? 'bun' : 'node', version: isBun ? Bun.version : process.versions.node });
  return { send, hold, exitWhenFlushed };
}
