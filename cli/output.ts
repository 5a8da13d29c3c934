/**
 * CLI output: aligned tables for people, JSON (`--json`) for scripts, byte and rate formatting.
 */

/** `1536` -> `1.5 KiB`. */
export function bytes(n: number | null | undefined): string {
  if (n === null || n === undefined || !Number.isFinite(n)) return '-'
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB']
  let v = n
  let i = 0
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024
    i++
  }
  return `${i === 0 ? v : v.toFixed(1)} ${units[i]}`
}

/** Prints `rows` as an aligned table with `headers`, or as JSON when `json`. */
export function table(json: boolean, items: unknown[], headers: string[], row: (item: any) => Array<string | number | null | undefined>): void {
  if (json) {
    process.stdout.write(JSON.stringify(items, null, 2) + '\n')
    return
  }
  const rows = [headers, ...items.map((i) => row(i).map((c) => (c === null || c === undefined ? '-' : String(c))))]
  const widths = headers.map((_, c) => Math.max(...rows.map((r) => r[c].length)))
  for (const r of rows)
    process.stdout.write(
      r
        .map((c, i) => c.padEnd(widths[i]))
        .join('  ')
        .trimEnd() + '\n',
    )
}

/** Prints one object as JSON (always: objects have no table form). */
export function show(obj: unknown): void {
  process.stdout.write(JSON.stringify(obj, null, 2) + '\n')
}
