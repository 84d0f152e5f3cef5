// Parses each AsyncAPI document named on the command line with the official parser
// (@asyncapi/parser, pinned in package.json and package-lock.json) and fails on any diagnostic
// of severity error or warning, printing them all. Run by scripts/check-asyncapi.
import { readFileSync } from "node:fs";
import { Parser } from "@asyncapi/parser";

const severities = ["error", "warning", "information", "hint"];
const parser = new Parser();
let failed = false;
for (const file of process.argv.slice(2)) {
  const { document, diagnostics } = await parser.parse(readFileSync(file, "utf8"), {
    source: file,
  });
  const serious = diagnostics.filter((d) => d.severity <= 1);
  for (const d of diagnostics) {
    const where = (d.path || []).join("/");
    console.error(`${file}: ${severities[d.severity]}: ${d.code}: ${d.message} (at /${where})`);
  }
  if (!document || serious.length > 0) {
    failed = true;
    console.error(`${file}: does not parse cleanly (${serious.length} error(s) or warning(s))`);
    continue;
  }
  const channels = document.channels().all().map((c) => c.address());
  const messages = document.messages().all().length;
  console.log(
    `${file}: AsyncAPI ${document.version()}, ${channels.length} channel(s) (${channels.join(", ")}), ${messages} message(s): ok`,
  );
}
process.exit(failed ? 1 : 0);
