/**
 * Runs the real `migrator` command (the bash launcher `cli/migrator`, the package's `bin` entry)
 * as a child process, the way an operator's shell does: a clean environment (no inherited
 * `MIGRATOR_*`, a PATH without `node_modules/.bin`), any working directory, stdout/stderr
 * captured, a hard time limit (SIGKILL of the whole process group).
 */
import { spawn, type ChildProcess } from 'node:child_process'
import * as path from 'node:path'
import { tokenFor } from './test-auth.ts'
import { REPO } from './tmp.ts'

/** The launcher (`package.json` `bin.migrator`). */
export const MIGRATOR_BIN = path.join(REPO, 'cli/migrator')

/** PATH of the CLI children: system directories only (never `node_modules/.bin`). */
export const SYSTEM_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'

/** How one run ended: exit `code` (null when killed), the `signal`, captured output, wall time in ms. */
export interface CliResult {
  code: number | null
  signal: NodeJS.Signals | null
  stdout: string
  stderr: string
  ms: number
}

/** Options of {@link runCli} / {@link startCli}. */
export interface CliOptions {
  /** Environment of the child, over `{PATH: SYSTEM_PATH, HOME}` (nothing else is inherited). */
  env?: Record<string, string>
  /** Working directory (default: the repository's parent, so no relative path resolves by accident). */
  cwd?: string
  /** Hard limit in ms (default 60 000): the child's process group gets SIGKILL. */
  timeoutMs?: number
  /** The launcher to run (default {@link MIGRATOR_BIN}; e.g. a symlink to it, as npm installs). */
  bin?: string
}

/** A CLI child running in the background. */
export interface RunningCli {
  child: ChildProcess
  /** Output captured so far. */
  stdout(): string
  stderr(): string
  /** Resolves when the child exits (or is killed at the time limit). */
  result: Promise<CliResult>
  /** SIGKILL to the child's process group (no-op once it exited). */
  kill(): void
}

/**
 * The API token of the test server a CLI run talks to (its `--url`, else `MIGRATOR_URL`), as
 * `MIGRATOR_TOKEN`, when that server is registered (test/helpers/test-auth.ts) and the run brings
 * no credential of its own; else nothing. What root's CLI reads from the server's data directory.
 */
function tokenEnv(args: string[], env: Record<string, string>): Record<string, string> {
  if (env.MIGRATOR_TOKEN !== undefined || env.MIGRATOR_USER !== undefined || args.includes('--user')) return {}
  const i = args.indexOf('--url')
  const url = i >= 0 ? args[i + 1] : env.MIGRATOR_URL
  const token = url ? tokenFor(url) : null
  return token ? { MIGRATOR_TOKEN: token } : {}
}

/** Starts `migrator <args>` in the background (own process group). */
export function startCli(args: string[], opts: CliOptions = {}): RunningCli {
  const started = Date.now()
  const child = spawn(opts.bin ?? MIGRATOR_BIN, args, {
    cwd: opts.cwd ?? path.dirname(REPO),
    env: { PATH: SYSTEM_PATH, HOME: process.env.HOME ?? '/root', ...tokenEnv(args, opts.env ?? {}), ...opts.env },
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  })
  let out = ''
  let err = ''
  child.stdout!.on('data', (d) => (out += d))
  child.stderr!.on('data', (d) => (err += d))
  const kill = () => {
    if (child.exitCode !== null || child.signalCode !== null || child.pid === undefined) return
    try {
      process.kill(-child.pid, 'SIGKILL')
    } catch {
      /* already gone */
    }
  }
  const timer = setTimeout(kill, opts.timeoutMs ?? 60_000)
  const result = new Promise<CliResult>((resolve) => {
    child.once('close', (code, signal) => {
      clearTimeout(timer)
      resolve({ code, signal, stdout: out, stderr: err, ms: Date.now() - started })
    })
  })
  return { child, stdout: () => out, stderr: () => err, result, kill }
}

/** Runs `migrator <args>` to its end. */
export function runCli(args: string[], opts: CliOptions = {}): Promise<CliResult> {
  return startCli(args, opts).result
}

/** Parses NDJSON output (one JSON value per non-empty line). */
export function ndjson(text: string): any[] {
  return text
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((l) => JSON.parse(l))
}
