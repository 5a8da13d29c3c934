/**
 * Process handling shared by the virt-v2v runners (DESIGN.md section 6): `virt-v2v-in-place` in
 * the V2vProcessing state (`preparer.ts`) and `virt-v2v` in the VMCX passthrough import
 * (`full-import.ts`).
 *
 * - The tool runs in its own process group (stdin closed); cancellation and the time limit send
 *   SIGTERM to the group, SIGKILL 5 s later; once the tool exits, whatever it left in its group
 *   (qemu, nbdkit, nbdcopy holding the pipes) is killed.
 * - Output (virt-v2v(1) "Machine readable output"): stdout lines matching `^[0-9]+/[0-9]+$` are
 *   progress, other stdout lines are status messages, stderr lines are errors. virt-v2v 2.2 (Debian
 *   12) prints every message on stdout as one JSON object `{"message", "timestamp", "type":
 *   "message"|"info"|"warning"|"error"}` followed by its human form `[  12.3] text`: the JSON is
 *   parsed, the human duplicate dropped, and `error` messages are preferred over stderr for the
 *   failure's last lines.
 * - Copy progress, which virt-v2v 2.2 does not route through the `N/M` lines: `nbdcopy --progress`
 *   (libnbd 1.14 copy/progress.c) draws `<spinner> NN% [****----]` terminated by `\r` (`\n` at
 *   100 %) on the inherited stderr; virt-v2v 1.x printed qemu-img's `(NN.NN/100%)`. Both are parsed
 *   as progress and kept out of the error lines.
 * Every line is bounded to 2000 characters, escape sequences and control characters removed.
 */
import { constants } from 'node:fs'
import { access, stat } from 'node:fs/promises'
import * as path from 'node:path'
import { exec } from '../exec.ts'

/** A progress report: `fraction` in 0..1 from a progress line, or a status `message`. */
export interface V2vProgress {
  fraction: number | null
  message: string | null
}

/**
 * How a run ended, what it printed: `lastLines` are the last error lines (JSON errors, else
 * stderr, else status messages; at most 20), `stderrLines` the last 20 stderr lines that are not
 * progress (optional so hand-made outcomes may omit it).
 */
export interface ToolOutcome {
  kind: 'ok' | 'failed' | 'timeout' | 'cancelled'
  code: number | null
  signal: string | null
  lastLines: string[]
  stderrLines?: string[]
  messages: string[]
  lastFraction: number | null
  warnings: string[]
}

/** Options of {@link runV2vTool}: abort signal, time limit (ms), progress/message callback, SIGTERM-to-SIGKILL grace (ms, default 5000). */
export interface ToolRunOptions {
  signal?: AbortSignal
  timeoutMs: number
  onProgress?: (p: V2vProgress) => void
  killGraceMs?: number
}

const MAX_LINE = 2000
const KEEP_ERRORS = 20
const KEEP_MESSAGES = 200

/**
 * Absolute path of `binary` (a path, or a name looked up in the `PATH` string `pathEnv`), or null
 * when it is missing or not an executable regular file. Never throws.
 */
export async function resolveBinary(binary: string, pathEnv: string): Promise<string | null> {
  const candidates = binary.includes('/')
    ? [binary]
    : pathEnv
        .split(':')
        .filter((d) => d.startsWith('/'))
        .map((d) => path.join(d, binary))
  for (const c of candidates) {
    try {
      const st = await stat(c)
      if (!st.isFile()) continue
      await access(c, constants.X_OK)
      return c
    } catch {
      /* next */
    }
  }
  return null
}

/** Splits a byte stream into lines (`\n`, `\r\n` or `\r`), bounding each line to 2000 characters and the pending buffer to 64 KiB. */
export function lineSplitter(onLine: (line: string) => void): { push(chunk: Buffer): void; end(): void } {
  let buf = ''
  return {
    push(chunk) {
      buf += chunk.toString('utf8')
      const parts = buf.split(/\r\n|\r|\n/)
      buf = parts.pop() ?? ''
      if (buf.length > 64 * 1024) buf = buf.slice(-MAX_LINE)
      for (const p of parts) onLine(p.slice(0, MAX_LINE))
    },
    end() {
      if (buf !== '') onLine(buf.slice(0, MAX_LINE))
      buf = ''
    },
  }
}

/** A line without ANSI escape sequences, control characters and trailing blanks. */
export function cleanLine(l: string): string {
  return l
    .replace(/\x1b\[[0-9;]*[A-Za-z]/g, '')
    .replace(/[\x00-\x08\x0b-\x1f\x7f]/g, '')
    .trimEnd()
}

/**
 * The fraction (0..1) a progress line stands for, or null when it is not one: `N/M` (virt-v2v
 * machine-readable progress; M > 0), nbdcopy's bar `<spinner> NN% [****----]`, qemu-img's
 * `(NN.NN/100%)` (virt-v2v 1.x).
 */
export function progressFraction(line: string): number | null {
  let m = /^([0-9]{1,15})\/([0-9]{1,15})$/.exec(line)
  if (m) {
    const den = Number(m[2])
    return den > 0 ? Math.min(1, Number(m[1]) / den) : null
  }
  m = /^\S{0,4}\s*([0-9]{1,3})% \[[*-]{10,80}\]$/.exec(line)
  if (m) return Math.min(1, Number(m[1]) / 100)
  m = /^\s*\(([0-9]{1,3}(?:\.[0-9]{1,4})?)\/100%\)$/.exec(line)
  if (m) return Math.min(1, Number(m[1]) / 100)
  return null
}

/**
 * Spawns `bin args` with exactly `env`, in a new process group, stdin closed, and resolves when
 * it has exited and its pipes are closed (see the module comment). Never rejects for the tool's
 * own failure (the outcome says it); rejects only when the process cannot be spawned.
 */
export async function runV2vTool(bin: string, args: string[], env: Record<string, string>, opts: ToolRunOptions): Promise<ToolOutcome> {
  const errors: string[] = []
  const messages: string[] = []
  const jsonErrors: string[] = []
  const warnings: string[] = []
  let lastFraction: number | null = null
  let lastJsonText: string | null = null

  const push = (list: string[], line: string, keep: number) => {
    list.push(line)
    if (list.length > keep) list.shift()
  }
  const progress = (f: number) => {
    lastFraction = f
    opts.onProgress?.({ fraction: f, message: null })
  }
  const status = (line: string) => {
    push(messages, line, KEEP_MESSAGES)
    opts.onProgress?.({ fraction: null, message: line })
  }
  const out = lineSplitter((raw) => {
    const line = cleanLine(raw)
    if (line === '') return
    const f = progressFraction(line.trim())
    if (f !== null) return progress(f)
    if (line.startsWith('{')) {
      let j: unknown
      try {
        j = JSON.parse(line)
      } catch {
        j = null
      }
      if (j && typeof j === 'object' && typeof (j as { message?: unknown }).message === 'string') {
        const o = j as { message: string; type?: unknown }
        const text = cleanLine(o.message.replace(/\s*\n\s*/g, ' ')).slice(0, MAX_LINE)
        const type = String(o.type ?? 'message')
        lastJsonText = text
        if (type === 'error') push(jsonErrors, text, KEEP_ERRORS)
        else if (type === 'warning') push(warnings, text, KEEP_MESSAGES)
        status(type === 'message' || type === 'info' ? text : `${type}: ${text}`)
        return
      }
    }
    // The same message again in human form ("[   1.0] Opening the source") right after its JSON form.
    const human = /^\[\s*[0-9.]+\] (.*)$/.exec(line)
    if (human && lastJsonText !== null && human[1] === lastJsonText) return
    status(line)
  })
  const err = lineSplitter((raw) => {
    const line = cleanLine(raw)
    if (line === '') return
    const f = progressFraction(line.trim())
    if (f !== null) return progress(f)
    push(errors, line, KEEP_ERRORS)
  })
  // Own process group: the time limit and cancel stop the whole group (SIGTERM, SIGKILL after
  // the grace), and once the tool exits, helpers it left in the group (qemu, nbdkit) are killed.
  const r = await exec(bin, args, {
    env,
    processGroup: true,
    timeoutMs: opts.timeoutMs,
    signal: opts.signal,
    killGraceMs: opts.killGraceMs ?? 5000,
    collect: false,
    onStdout: (c) => out.push(c),
    onStderr: (c) => err.push(c),
  })
  if (r.spawnError) throw r.spawnError
  out.end()
  err.end()
  const stderrLines = errors.filter((l) => !/^If reporting bugs|^\s*\S+ -v -x \[\.\.\.\]$/.test(l))
  const lastLines = jsonErrors.length ? jsonErrors.slice(-KEEP_ERRORS) : stderrLines.length ? stderrLines.slice(-KEEP_ERRORS) : messages.slice(-KEEP_ERRORS)
  const kind = r.timedOut ? 'timeout' : r.aborted ? 'cancelled' : r.code === 0 ? 'ok' : 'failed'
  return { kind, code: r.code, signal: r.signal, lastLines, stderrLines, messages, lastFraction, warnings }
}

/** Words for a failed outcome: `timed out`, `killed by SIGSEGV`, `exited with status 1`. */
export function describeFailure(o: ToolOutcome): string {
  return o.kind === 'timeout' ? 'timed out' : o.signal ? `killed by ${o.signal}` : `exited with status ${o.code}`
}

/** A guest name safe for virt-v2v's `-on`, output file names and input XML: `[A-Za-z0-9_.-]`, at most 63, never starting with `.`/`_`/`-`; `guest` when nothing is left. */
export function v2vOutputName(name: string): string {
  return (
    name
      .replace(/[^A-Za-z0-9_.-]+/g, '_')
      .replace(/^[._-]+/, '')
      .slice(0, 63) || 'guest'
  )
}
