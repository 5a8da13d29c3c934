/**
 * Structured JSON logging (pino). One logger per server; request logs carry method, path,
 * status and duration in milliseconds. Secrets are redacted by key name.
 */
import pino from 'pino'

/** The logger type handlers and the runtime use. */
export type Logger = pino.Logger

/** Creates the server's logger at `level` (`silent` disables output). */
export function createLogger(level: string): Logger {
  return pino({
    level,
    base: { svc: 'migrator' },
    redact: { paths: ['password', '*.password', 'secret', '*.secret', 'authorization', '*.authorization'], censor: '[redacted]' },
  })
}
