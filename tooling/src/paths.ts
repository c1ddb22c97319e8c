import { fileURLToPath } from "node:url";

/** The project's default model repository (`<root>/models`), from this file's place in tooling/. */
export const DEFAULT_REPOSITORY = fileURLToPath(new URL("../../models", import.meta.url));
