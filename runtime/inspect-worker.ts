/**
 * Worker-thread entry of the inspect pool (`runtime/inspect-pool.ts`): runs `inspectInput` for
 * each request message `{id, absPath, ctx, kind?}` and answers `{id, ok: true, result}` or
 * `{id, ok: false, error: {code, message, details?}}`, so that parsing a large descriptor never
 * holds the server's event loop.
 */
import { parentPort } from 'node:worker_threads'
import { MigError } from '../lib/errors.ts'
import { inspectInput } from '../lib/importers/index.ts'
import type { InspectRequest, InspectReply } from './inspect-pool.ts'

parentPort!.on('message', (m: InspectRequest) => {
  void (async () => {
    let reply: InspectReply
    try {
      reply = { id: m.id, ok: true, result: await inspectInput(m.absPath, m.ctx, m.kind) }
    } catch (e) {
      const err = e instanceof MigError ? e : new MigError('E_MIG_INTERNAL', `inspect failed: ${(e as Error)?.message ?? String(e)}`)
      reply = { id: m.id, ok: false, error: { code: err.code, message: err.message, details: err.details, status: err.status } }
    }
    parentPort!.postMessage(reply)
  })()
})
