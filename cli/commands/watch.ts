/**
 * `migrator watch <id>`: live state and progress of one migration from the SSE stream (spec 6),
 * a banner for non-fatal notices (`E_MIG_CBT_UNSUPPORTED`), exit 0 only when it is Completed
 * (1 Failed, 2 Cancelled).
 */
import cliProgress from 'cli-progress'
import type { Command } from 'commander'
import { bytes } from '../output.ts'
import type { Api } from '../api.ts'
import { globals, apiOf, run } from './common.ts'

const TERMINAL = new Set(['Completed', 'Failed', 'Cancelled'])

/** Exit status of a final job state: 0 `Completed`, 2 `Cancelled`, 1 anything else (`Failed`). */
export function exitCodeOf(state: string): number {
  return state === 'Completed' ? 0 : state === 'Cancelled' ? 2 : 1
}

/**
 * Follows job `id` until it ends, printing state changes, progress (a bar on a terminal, a line
 * a second otherwise, NDJSON `{event: state|progress|notice|end}` with `json`) and non-fatal notices;
 * returns the exit status ({@link exitCodeOf}). Throws `ApiError` (`E_MIG_NOT_FOUND` for an
 * unknown job, transport errors with a null code).
 */
export async function watchJob(api: Api, id: string, json: boolean): Promise<number> {
  const tty = process.stdout.isTTY === true && !json
  // A terminal gets a bar (cli-progress); its own `{total}`/`{value}` tokens are raw numbers, hence `_h`.
  const multi = tty
    ? new cliProgress.MultiBar(
        { format: '{state} |{bar}| {percentage}% {done_h}/{total_h} {rate}/s eta {eta_s}s', hideCursor: true },
        cliProgress.Presets.shades_classic,
      )
    : null
  let stopped = false
  let bar: cliProgress.SingleBar | null = null
  let state = ''
  let lastLine = 0
  let notice = ''
  let final: any = null
  // Lines go above the bar while it is drawn (MultiBar.log), straight to stdout once it is stopped.
  const say = (line: string) => (multi && bar && !stopped ? multi.log(line + '\n') : process.stdout.write(line + '\n'))
  const stopBar = () => {
    if (!multi || stopped) return
    if (bar) multi.update() // flushes the lines logged since the last redraw (stop() does not)
    multi.stop()
    stopped = true
  }
  const drawBar = (st: string, pr: any) => {
    const fields = { state: st, done_h: bytes(pr.bytes_done), total_h: bytes(pr.bytes_total), rate: bytes(pr.rate_bytes_per_s), eta_s: pr.eta_s ?? '?' }
    bar ??= multi!.create(pr.bytes_total || 1, 0, fields)
    if (bar.getTotal() !== pr.bytes_total) bar.setTotal(pr.bytes_total || 1)
    bar.update(pr.bytes_done ?? 0, fields)
  }
  let seenUpdate = ''
  const onJob = (job: any) => {
    // The stream and the GET that follows its connection may overlap: never step back in time.
    if (typeof job?.updated_at === 'string') {
      if (job.updated_at < seenUpdate) return
      seenUpdate = job.updated_at
    }
    if (TERMINAL.has(job.state)) final = job
    if (multi && !stopped && (bar || final) && job.progress) drawBar(job.state, job.progress)
    if (final) stopBar()
    if (job.last_error && !job.last_error.fatal && job.last_error.code !== notice) {
      notice = job.last_error.code
      if (json) process.stdout.write(JSON.stringify({ event: 'notice', id, code: job.last_error.code, message: job.last_error.message }) + '\n')
      else say(`*** ${job.last_error.code}: ${job.last_error.message} ***`)
    }
    if (job.state !== state) {
      state = job.state
      if (json) process.stdout.write(JSON.stringify({ event: 'state', id, state }) + '\n')
      else say(`state: ${state}`)
    }
  }
  const onProgress = (p: any) => {
    const pr = p?.progress
    if (!pr || final) return
    if (json) return void process.stdout.write(JSON.stringify({ event: 'progress', id, state: p.state, ...pr }) + '\n')
    if (multi) drawBar(p.state, pr)
    else if (Date.now() - lastLine >= 1000) {
      lastLine = Date.now()
      process.stdout.write(`progress: ${bytes(pr.bytes_done)} of ${bytes(pr.bytes_total)} at ${bytes(pr.rate_bytes_per_s)}/s, ${bytes(pr.bytes_zero)} zero\n`)
    }
  }
  // Subscribe first, then read the job: a change between the two is on the stream, not lost.
  await api.follow(
    id,
    (name, data) => {
      if (name === 'migration' && data?.id === id) onJob(data)
      else if (name === 'progress' && data?.id === id) onProgress(data)
      return final !== null
    },
    {
      onOpen: async () => {
        onJob(await api.call('GET', `/migrations/${encodeURIComponent(id)}`))
        return final !== null
      },
    },
  )
  stopBar()
  if (!final) throw new Error(`stopped following migration ${id} before it ended`)
  if (final.last_error?.fatal && !json) say(`${final.last_error.code}: ${final.last_error.message}`)
  if (json) process.stdout.write(JSON.stringify({ event: 'end', id, state: final.state, last_error: final.last_error }) + '\n')
  else say(`migration ${id} ${final.state}`)
  return exitCodeOf(final.state)
}

/** Registers `watch`. */
export function register(program: Command): void {
  program
    .command('watch <id>')
    .description('follow a migration live until it ends (exit 0 only when Completed)')
    .action((id: string, _o, cmd: Command) => run(async () => process.exit(await watchJob(apiOf(cmd), id, globals(cmd).json))))
}
