/**
 * The one way lib/ runs a child process to completion (no shell): a time limit, an abort signal,
 * a cap on stdout, the tail of stderr, and optionally its own process group that is killed as a
 * whole. Used by the sinks (`zfs`, `blkdiscard`, `fallocate`, `cp`), `qemu-img info`/`check`,
 * `virsh` and the virt-v2v runners. Long-running servers (`qemu-nbd`, the worker processes) have
 * their own lifecycle and do not go through here.
 *
 * Written by hand rather than with execa: about 100 lines over `node:child_process`, the same under
 * Bun and Node 20, and the process-group semantics (kill what the tool left in its group once it
 * exits) are ours to define.
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { readFileSync } from 'node:fs'

/**
 * Options of {@link exec}.
 * - `timeoutMs`: time limit, milliseconds (none when absent); on expiry the process (group) gets
 *   SIGTERM, then SIGKILL after `killGraceMs`.
 * - `signal`: aborting it stops the process the same way.
 * - `killGraceMs`: SIGTERM-to-SIGKILL grace, milliseconds; 0 (the default) sends SIGKILL at once.
 * - `processGroup`: run in a new process group (`detached`) and signal the whole group; once the
 *   leader exits, whatever it left in its group is killed too (SIGKILL).
 * - `env`: the environment (default: the parent's).
 * - `maxStdout`: stdout bytes kept (default 8 MiB); more kills the process and sets `overflow`.
 * - `stderrTail`: bytes of stderr kept, the last ones (default 64 KiB).
 * - `onStdout`/`onStderr`: every chunk as it arrives.
 * - `collect`: false to keep no output at all (a caller that parses the chunks itself; no cap).
 * - `input`: written to the child's stdin, which is then closed (default: stdin is `/dev/null`).
 */
export interface ExecOptions {
  timeoutMs?: number
  signal?: AbortSignal
  killGraceMs?: number
  processGroup?: boolean
  env?: NodeJS.ProcessEnv
  maxStdout?: number
  stderrTail?: number
  onStdout?: (chunk: Buffer) => void
  onStderr?: (chunk: Buffer) => void
  collect?: boolean
  /** Open file descriptors handed to the child as its fds 3, 4, ... (read as `/dev/fd/N`). */
  fds?: readonly number[]
  input?: string | Buffer
}

/**
 * How a run ended. `code`: exit status, null when a signal ended it or it never started.
 * `signal`: the signal that ended it. `stdout` (UTF-8, at most `maxStdout` bytes), `stderr` (its
 * last `stderrTail` bytes). `timedOut`/`aborted`/`overflow`: why it was stopped, if it was (only
 * the first reason is set).
 * `spawnError`: set when the process could not be started (ENOENT, EACCES); `stderr` then holds
 * its message.
 */
export interface ExecResult {
  code: number | null
  signal: NodeJS.Signals | null
  stdout: string
  stderr: string
  timedOut: boolean
  aborted: boolean
  overflow: boolean
  spawnError: NodeJS.ErrnoException | null
}

const DEFAULT_MAX_STDOUT = 8 * 1024 * 1024
const DEFAULT_STDERR_TAIL = 64 * 1024

/** Runs `cmd args` (no shell; stdin `opts.input` or closed) to completion. Never rejects: a process that cannot start is `spawnError`. */
export function exec(cmd: string, args: readonly string[], opts: ExecOptions = {}): Promise<ExecResult> {
  const maxStdout = opts.maxStdout ?? DEFAULT_MAX_STDOUT
  const tail = opts.stderrTail ?? DEFAULT_STDERR_TAIL
  const collect = opts.collect !== false
  return new Promise((resolve) => {
    const out: Buffer[] = []
    let outLen = 0
    let err = Buffer.alloc(0)
    let timedOut = false
    let aborted = false
    let overflow = false
    let stopping = false
    let settled = false
    let timer: NodeJS.Timeout | undefined
    let killTimer: NodeJS.Timeout | undefined
    const result = (r: Partial<ExecResult>): ExecResult => ({
      code: null,
      signal: null,
      stdout: Buffer.concat(out).toString('utf8'),
      stderr: err.toString('utf8'),
      timedOut,
      aborted,
      overflow,
      spawnError: null,
      ...r,
    })
    let child: ChildProcess
    try {
      child = spawn(cmd, args, {
        stdio: [opts.input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe', ...(opts.fds ?? [])],
        detached: opts.processGroup === true,
        ...(opts.env ? { env: opts.env } : {}),
      })
    } catch (e) {
      const se = e as NodeJS.ErrnoException
      return resolve(result({ spawnError: se, stderr: se.message }))
    }
    const kill = (sig: NodeJS.Signals) => {
      try {
        if (opts.processGroup && child.pid !== undefined) process.kill(-child.pid, sig)
        else child.kill(sig)
      } catch {
        /* already gone */
      }
    }
    const stop = (why: 'timeout' | 'abort' | 'overflow') => {
      if (stopping) return
      stopping = true
      if (why === 'timeout') timedOut = true
      else if (why === 'abort') aborted = true
      else overflow = true
      const grace = opts.killGraceMs ?? 0
      if (grace <= 0) return kill('SIGKILL')
      kill('SIGTERM')
      killTimer = setTimeout(() => kill('SIGKILL'), grace)
    }
    const onAbort = () => stop('abort')
    const finish = (r: ExecResult) => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      clearTimeout(killTimer)
      opts.signal?.removeEventListener('abort', onAbort)
      resolve(r)
    }
    if (opts.timeoutMs !== undefined) {
      timer = setTimeout(() => stop('timeout'), opts.timeoutMs)
    }
    if (opts.signal?.aborted) queueMicrotask(onAbort)
    else opts.signal?.addEventListener('abort', onAbort, { once: true })
    if (opts.input !== undefined && child.stdin) {
      // a child that exits without reading its input is not an error of ours
      child.stdin.on('error', () => {})
      child.stdin.end(opts.input)
    }
    child.stdout!.on('data', (b: Buffer) => {
      opts.onStdout?.(b)
      if (!collect || overflow) return
      outLen += b.length
      if (outLen > maxStdout) return stop('overflow')
      out.push(b)
    })
    child.stderr!.on('data', (b: Buffer) => {
      opts.onStderr?.(b)
      if (!collect) return
      err = Buffer.concat([err, b])
      if (err.length > tail) err = err.subarray(err.length - tail)
    })
    child.once('error', (e: NodeJS.ErrnoException) => {
      // Only a process that never started ends here; errors of a running one end in 'close'.
      if (child.pid === undefined) finish(result({ spawnError: e, stderr: e.message }))
    })
    child.once('exit', () => {
      // The tool may leave helpers in its group holding the pipes: once it exits, none survives.
      if (opts.processGroup) kill('SIGKILL')
      // A stopped process is not waited for through a grandchild that still holds its pipes.
      if (stopping) {
        child.stdout?.destroy()
        child.stderr?.destroy()
      }
    })
    child.once('close', (code, signal) => finish(result({ code, signal })))
  })
}

/** Whether process `pid` exists (a process of another user counts: `kill(pid, 0)` gives EPERM). */
export function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM'
  }
}

/**
 * The pid in pid file `file` (decimal, optional trailing newline) when that process exists, else
 * null (no file, unreadable, not a positive integer, or the process is gone). Never throws.
 */
export function readLivePid(file: string): number | null {
  let pid: number
  try {
    pid = Number(readFileSync(file, 'utf8').trim())
  } catch {
    return null
  }
  return Number.isSafeInteger(pid) && pid > 0 && processAlive(pid) ? pid : null
}
