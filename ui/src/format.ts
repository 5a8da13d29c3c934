/** Display helpers: binary byte units, rates, durations, times. */

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB']

/** `bytes` as `12.3 MiB`. */
export function bytes(n: number | null | undefined): string {
  if (n === null || n === undefined || !Number.isFinite(n)) return '–'
  let v = n
  let u = 0
  while (Math.abs(v) >= 1024 && u < UNITS.length - 1) {
    v /= 1024
    u++
  }
  return `${u === 0 ? v : v.toFixed(1)} ${UNITS[u]}`
}

/** Bytes per second as `12.3 MiB/s`. */
export function rate(n: number | null | undefined): string {
  return n ? `${bytes(n)}/s` : '–'
}

/** Seconds as `1 h 02 min`, `3 min 05 s`, `12 s`. */
export function duration(s: number | null | undefined): string {
  if (s === null || s === undefined || !Number.isFinite(s)) return '–'
  const t = Math.max(0, Math.round(s))
  if (t >= 3600) return `${Math.floor(t / 3600)} h ${String(Math.floor((t % 3600) / 60)).padStart(2, '0')} min`
  if (t >= 60) return `${Math.floor(t / 60)} min ${String(t % 60).padStart(2, '0')} s`
  return `${t} s`
}

/** An ISO time as local `HH:MM:SS` (with the date when not today). */
export function time(iso: string | null | undefined): string {
  if (!iso) return '–'
  const d = new Date(iso)
  const today = new Date().toDateString() === d.toDateString()
  return today ? d.toLocaleTimeString() : d.toLocaleString()
}

/** Percentage of `done` in `total` (0 when total is 0), clamped to 0..100. */
export function percent(done: number, total: number): number {
  return total > 0 ? Math.min(100, Math.max(0, (done / total) * 100)) : 0
}
