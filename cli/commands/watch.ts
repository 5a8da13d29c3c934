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

/** Exit status of a final job state. */
export function exitCodeOf(state: string): number {
  return state === 'Completed' ? 0 : state === 'Cancelled' ? 2 : 1
}

/** Follows job `id` until it ends; prints as it goes; returns the exit status. */
export async function watchJob(api: Api, id: string, json: boolean): Promise<number> {
  const tty = process.stdout.isTTY === true && !json
  const multi = tty ? new cliProgress.MultiBar({ format: '{state} |{bar}| {percentage}% {done}/{total} {rate}/s eta {eta_s}s', hideCursor: true }, cliProgress.Presets.shades_classic) : null
  let bar: cliProgress.SingleBar | null = null
  let state = ''
  let lastLine = 0
  let notice = ''
  let final: any = null
  const say = (line: string) => (multi ? multi.log(line + '\n') : process.stdout.write(line + '\n'))
  const onJob = (job: any) => {
    if (job.last_error && !job.last_error.fatal && job.last_error.code !== notice) {
      notice = job.last_error.code
      say(`*** ${job.last_error.code}: ${job.last_error.message} ***`)
    }
    if (job.state !== state) {
      state = job.state
      if (json) process.stdout.write(JSON.stringify({ event: 'state', id, state }) + '\n')
      else say(`state: ${state}`)
    }
    if (TERMINAL.has(job.state)) final = job
  }
  const onProgress = (p: any) => {
    const pr = p.progress
    if (json) return void process.stdout.write(JSON.stringify({ event: 'progress', id, ...pr }) + '\n')
    const fields = { state: p.state, done: bytes(pr.bytes_done), total: bytes(pr.bytes_total), rate: bytes(pr.rate_bytes_per_s), eta_s: pr.eta_s ?? '?' }
    if (multi) {
      bar ??= multi.create(pr.bytes_total || 1, 0, fields)
      if (bar.getTotal() !== pr.bytes_total) bar.setTotal(pr.bytes_total || 1)
      bar.update(pr.bytes_done, fields)
    } else if (Date.now() - lastLine >= 1000) {
      lastLine = Date.now()
      process.stdout.write(`progress: ${fields.done} of ${fields.total} at ${fields.rate}/s, ${bytes(pr.bytes_zero)} zero\n`)
    }
  }
  onJob(await api.call('GET', `/migrations/${encodeURIComponent(id)}`))
  if (!final) {
    await api.follow(id, (name, data) => {
      if (name === 'migration') onJob(data)
      else if (name === 'progress') onProgress(data)
      return final !== null
    })
  }
  multi?.stop()
  if (final.last_error?.fatal) say(`${final.last_error.code}: ${final.last_error.message}`)
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
