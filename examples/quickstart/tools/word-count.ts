// A script-module tool. goondan-rs validates and catalogs it; running script
// tools needs the JS worker of a later release (calls return E_TOOL_NOT_FOUND).
export const handlers = {
  count: async (_ctx: unknown, input: { text: string }) => ({
    words: input.text.split(/\s+/).filter(Boolean).length,
  }),
};
