/**
 * `migrator audit [--since <time>] [--until <time>] [--kind <kind>] [--limit <n>] [--all]`: the
 * audit log of state-changing requests (`GET /audit`), newest first. `--all` follows
 * `next_cursor` to the last page. With `--json`, the entries as an array.
 */
import type { Command } from 'commander'
import { table } from '../output.ts'
import { apiOf, globals, run } from './common.ts'

interface AuditOpts {
  since?: string
  until?: string
  kind?: string
  limit: string
  all?: boolean
}

/** Registers `audit`. */
export function register(program: Command): void {
  program
    .command('audit')
    .description('the audit log of state-changing requests, newest first')
    .option('--since <time>', 'entries at or after this RFC 3339 time (2026-01-31T00:00:00Z)')
    .option('--until <time>', 'entries before this RFC 3339 time')
    .option('--kind <kind>', 'a resource (migration, source, upload, ...) or a kind (migration.cancel)')
    .option('--limit <n>', 'entries per page', '100')
    .option('--all', 'every page, not only the first')
    .action((o: AuditOpts, cmd: Command) =>
      run(async () => {
        const api = apiOf(cmd)
        const items: unknown[] = []
        let cursor: number | null = null
        do {
          const q = new URLSearchParams({ limit: o.limit })
          if (o.since) q.set('since', o.since)
          if (o.until) q.set('until', o.until)
          if (o.kind) q.set('kind', o.kind)
          if (cursor !== null) q.set('cursor', String(cursor))
          const page: { items: unknown[]; next_cursor: number | null } = await api.call('GET', `/audit?${q}`)
          items.push(...page.items)
          cursor = page.next_cursor
        } while (o.all && cursor !== null)
        table(globals(cmd).json, items, ['TIME', 'CLIENT', 'METHOD', 'ROUTE', 'KIND', 'RESOURCE', 'STATUS', 'ERROR', 'REQUEST ID'], (e) => [
          e.at,
          e.client_address,
          e.method,
          e.route,
          e.kind,
          e.resource_id,
          e.status,
          e.error_code,
          e.request_id,
        ])
      }),
    )
}
