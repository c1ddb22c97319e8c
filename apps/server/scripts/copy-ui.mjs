// Copies the page's built files (@trellis/web's dist, built first by turbo: a devDependency) into dist/ui,
// so that an installed @trellis/server serves them without @trellis/web. Without a built page, none is copied
// and the server says the page is off.
import { cpSync, existsSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const from = join(here, "..", "node_modules", "@trellis", "web", "dist");
const to = join(here, "..", "dist", "ui");
rmSync(to, { recursive: true, force: true });
if (existsSync(join(from, "index.html"))) cpSync(from, to, { recursive: true });
else console.warn(`copy-ui: ${from} has no index.html (build @trellis/web first); the server will have no page`);
