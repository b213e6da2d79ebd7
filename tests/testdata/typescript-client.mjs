// The MCP TypeScript SDK's client (@modelcontextprotocol/client, the version the pinned MCP
// Inspector installs) driven against the front door as an agent framework drives it:
// TestFrontDoorTypeScriptClient runs it and checks what it prints, one JSON object.
//
// Usage: node typescript-client.mjs URL TOKEN
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';

const [url, token] = process.argv.slice(2);
const out = { errors: [], progress: [], asked: [], changed: [] };
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client({ name: 'ringfence-e2e', version: '1' }, {
  // Form elicitation: a call that asks a person first is put to this client's user.
  capabilities: { elicitation: { form: {} } },
  listChanged: { tools: { onChanged: (err, tools) => out.changed.push(err ? `error: ${err.message}` : tools.map((t) => t.name)) } },
});
client.setRequestHandler('elicitation/create', async (req) => {
  out.asked.push(req.params.message);
  return { action: 'accept', content: {} };
});
client.onerror = (err) => out.errors.push(err.message);

// call answers what a model would be shown, or the JSON-RPC error the SDK threw.
async function call(name, args, options) {
  try {
    return await client.callTool({ name, arguments: args }, options);
  } catch (err) {
    return { thrown: { code: err.code, message: err.message } };
  }
}

await client.connect(transport);
out.protocolVersion = transport.protocolVersion;
out.sessionId = transport.sessionId;
out.server = client.getServerVersion();
out.tools = (await client.listTools()).tools.map((t) => t.name);
// The SDK checks structuredContent against the listed outputSchema, and throws when it does
// not match.
out.wide = await call('fx__wide', { n: 3 });
out.progressResult = await call('fx__progress', { steps: 3, message: 'step' }, {
  onprogress: (p) => out.progress.push(p),
});
out.refused = await call('fx__echo', { text: 42 });
out.unknown = await call('fx__nope', {});
out.confirmed = await call('fx__add', { a: 20, b: 22 });
out.search = await call('tool_search', { query: 'echo' });
// tool_search loaded lazy__echo: the client hears of it and reads the listing again.
for (let i = 0; i < 100 && !out.changed.some((c) => Array.isArray(c) && c.includes('lazy__echo')); i++) {
  await new Promise((r) => setTimeout(r, 100));
}
out.loaded = await call('lazy__echo', { text: 'héllo 🙂 日本' });
await client.ping();
await transport.terminateSession();
await client.close();
console.log(JSON.stringify(out));
