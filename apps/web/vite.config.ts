import { defineConfig } from "vite";

// Served by the server under /ui/ (apps/server/src/web-page.ts); everything local, nothing from a CDN.
export default defineConfig({
  base: "/ui/",
  build: { outDir: "dist", emptyOutDir: true, target: "es2022", modulePreload: { polyfill: false } },
});
