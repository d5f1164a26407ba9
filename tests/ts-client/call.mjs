// The MCP TypeScript SDK (what desktop clients and IDEs use) calling a server over stdio, for the tests.
//
//   node tests/ts-client/call.mjs CALLS_JSON COMMAND [ARG...]
//
// Starts COMMAND as a stdio server (with this process's environment), lists its tools, then makes each call of
// CALLS_JSON ([{"name": TOOL, "arguments": {...}}, ...]) in turn, as a desktop client does: `onprogress` set,
// `resetTimeoutOnProgress: true` and the SDK's default request timeout (60 s). Prints one JSON line:
// {"tools": {NAME: inputSchema}, "calls": [{name, seconds, progress: [{at, progress, message}],
//  result: {isError, text, structuredContent} | error: {code, message}}]}.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [callsJson, command, ...args] = process.argv.slice(2);
const calls = JSON.parse(callsJson);
const transport = new StdioClientTransport({ command, args, env: process.env, stderr: "inherit" });
const client = new Client({ name: "llamaforge-tests", version: "1.0.0" });
const report = { tools: {}, calls: [] };

await client.connect(transport);
try {
  for (const tool of (await client.listTools()).tools) {
    report.tools[tool.name] = tool.inputSchema;
  }
  for (const call of calls) {
    const started = performance.now();
    const seconds = () => (performance.now() - started) / 1000;
    const progress = [];
    const entry = { name: call.name, progress };
    try {
      const result = await client.callTool({ name: call.name, arguments: call.arguments }, undefined, {
        onprogress: (update) =>
          progress.push({ at: seconds(), progress: update.progress, message: update.message ?? null }),
        resetTimeoutOnProgress: true,
      });
      entry.result = {
        isError: result.isError ?? false,
        text: result.content.map((block) => block.text ?? "").join("\n"),
        structuredContent: result.structuredContent ?? null,
      };
    } catch (error) {
      entry.error = { code: error.code ?? null, message: String(error.message ?? error) };
    }
    entry.seconds = seconds();
    report.calls.push(entry);
  }
} finally {
  await client.close();
}
process.stdout.write(JSON.stringify(report) + "\n");
