// A script-module tool: goondan-rs runs it on Bun (or GOONDAN_JS_RUNTIME),
// in a host process started at its first call.
export const handlers = {
  count: async (_ctx: unknown, input: { text: string }) => ({
    words: input.text.split(/\s+/).filter(Boolean).length,
  }),
};
