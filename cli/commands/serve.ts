/** `migrator serve`: runs the server in this process (configuration from the environment). */
import type { Command } from 'commander'

/** Registers `serve`. */
export function register(program: Command): void {
  program
    .command('serve')
    .description('run the migrator server (MIGRATOR_* environment variables configure it)')
    .action(async () => {
      if (typeof (globalThis as { Bun?: unknown }).Bun !== 'undefined') await import('../../runtime/serve-bun.ts')
      else await import('../../runtime/serve-node.ts')
    })
}
