/**
 * Which files a load request may upload when the operator has not allowed unsafe overrides.
 *
 * A name is judged as it will be written, never as it was sent: `1/model.js/`, `1/model.js/.`
 * and `1/x/../model.js` all write `1/model.js`, so the request's name is first normalized the
 * way the write normalizes it, and the result is what is tested. What is refused is what a
 * loader could run: any file Node, ONNX Runtime's custom-op loader or Python would load as code
 * (any case), the folders their module resolution searches, and the file the model's own config
 * names as its code (a Python model's `default_model_filename`, a TypeScript stage's `module`),
 * whatever its extension.
 */
import { basename, isAbsolute, posix, win32 } from "node:path";
import type { ModelConfig } from "@trellis/protocol";

/**
 * Extensions some loader runs: Node (js/ts and their module variants, native addons,
 * WebAssembly), shared libraries (ONNX Runtime's custom ops, Python's extension modules: a
 * `.so` with or without a version suffix), Python (sources, bytecode, `.pth`, zip apps).
 */
const CODE_EXTENSION = /\.(?:[cm]?[jt]sx?|node|wasm|so(?:\.\d+)*|dylib|dll|py[cdwz]?|pth)$/i;

/** Names that change how Node or Python resolve modules next to them. */
const RESOLUTION_NAMES = new Set(["package.json", "node_modules", "__pycache__"]);

/** How a file override's name is written: folded like `path.resolve` would fold it, with `/` separators. */
export function normalizedUploadPath(path: string): string | undefined {
  // Backslashes are separators to Windows and to some archive tools: never accepted in a name.
  if (path.includes("\0") || path.includes("\\") || isAbsolute(path) || win32.isAbsolute(path)) return undefined;
  // Not rooted first: posix.normalize("/1/../../x") would clamp the climb at the root and hide it.
  const folded = posix.normalize(path).replace(/\/+$/, "");
  if (folded === "" || folded === "." || folded.startsWith("../") || folded === "..") return undefined;
  return folded;
}

/** The file names (lower case) the model's config makes a loader run, whatever their extension. */
function namedCode(config: ModelConfig, repository: ModelConfig | undefined): Set<string> {
  const names = new Set<string>(["model.py", "model.js", "model.mjs", "model.cjs"]);
  for (const c of [config, repository]) {
    if (!c) continue;
    if (c.defaultModelFilename && (c.backend === "python" || c.defaultModelFilename.endsWith(".py"))) {
      names.add(basename(c.defaultModelFilename).toLowerCase());
    }
    const module = c.parameters.module?.stringValue;
    if (module && (module.startsWith(".") || isAbsolute(module))) names.add(basename(module).toLowerCase());
  }
  return names;
}

/**
 * Why uploading `path` (already normalized) would let a client's code run, or undefined.
 * `config` is the request's config, `repository` the config the repository holds for the model.
 */
export function uploadedCodeProblem(
  path: string,
  config: ModelConfig,
  repository: ModelConfig | undefined,
): string | undefined {
  const segments = path.split("/");
  const file = (segments.at(-1) ?? "").toLowerCase();
  if (segments.some((s) => RESOLUTION_NAMES.has(s.toLowerCase()))) return "changes how modules are resolved";
  if (CODE_EXTENSION.test(file)) return "is executable code";
  if (namedCode(config, repository).has(file)) return "is the file the model's config runs as code";
  // Python imports a package from any folder with an __init__ file; the test above covers its
  // extensions, and a dotted name (a.b) is never an importable module: nothing more to refuse.
  return undefined;
}
