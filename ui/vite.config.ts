// Vite build of the web console: ui/ -> ui/dist/ (gitignored), served by handlers/ui/static.ts
// under {base}/ui/. Relative asset URLs (`base: './'`) so the console works under any API base
// path; everything is bundled (no CDN, no external fonts). Preact's JSX through esbuild.
import { defineConfig } from 'vite'

export default defineConfig({
  root: import.meta.dirname,
  base: './',
  esbuild: { jsx: 'automatic', jsxImportSource: 'preact' },
  build: { outDir: 'dist', emptyOutDir: true, assetsInlineLimit: 0, chunkSizeWarningLimit: 1024, reportCompressedSize: false },
  logLevel: 'warn',
})
