/**
 * `migrator uploads list|rm <id>` and `migrator host-files ls [path]` (spec 4). With `--json`,
 * `uploads list` prints the upload array and `host-files ls` the whole `{path, items, truncated}`.
 */
import type { Command } from 'commander'
import { bytes, show, table } from '../output.ts'
import { apiOf, globals, run } from './common.ts'

/** Registers `uploads` and `host-files`. */
export function register(program: Command): void {
  const uploads = program.command('uploads').description('uploaded archives')
  uploads
    .command('list')
    .description('list uploads')
    .action((_o, cmd: Command) =>
      run(async () => {
        const { items } = await apiOf(cmd).call('GET', '/uploads')
        table(globals(cmd).json, items, ['ID', 'FILE', 'SIZE', 'SHA256', 'EXPIRES'], (u) => [u.id, u.filename, bytes(u.size_bytes), u.sha256, u.expires_at])
      }),
    )
  uploads
    .command('rm <id>')
    .description('remove an upload')
    .action((id: string, _o, cmd: Command) =>
      run(async () => {
        await apiOf(cmd).call('DELETE', `/uploads/${encodeURIComponent(id)}`)
        if (!globals(cmd).json) process.stdout.write(`removed ${id}\n`)
      }),
    )
  program
    .command('host-files')
    .description('the import root')
    .command('ls [path]')
    .description('list a directory of the import root (relative path; default the root)')
    .action((p: string | undefined, _o, cmd: Command) =>
      run(async () => {
        const r = await apiOf(cmd).call('GET', `/host-files?path=${encodeURIComponent(p ?? '')}`)
        // JSON: the whole answer `{path, items, truncated}`, so scripts see a truncated listing.
        if (globals(cmd).json) return show(r)
        table(false, r.items, ['TYPE', 'SIZE', 'MODIFIED', 'PATH'], (e) => [e.type, e.type === 'file' ? bytes(e.size_bytes) : '', e.modified_at, e.path])
        if (r.truncated) process.stdout.write(`(listing truncated after ${r.items.length} entries)\n`)
      }),
    )
}
