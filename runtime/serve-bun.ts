/**
 * Serves the migrator under Bun (`npm start`). Configuration from the environment (config.ts).
 * `maxRequestBodySize` is set above the upload cap (Bun refuses bodies over 128 MiB otherwise);
 * the cap itself is enforced while streaming. SIGINT/SIGTERM shut down gracefully.
 */
import { createApp } from './app.ts'
import { loadConfig } from './config.ts'
import { logPreflight } from './preflight.ts'
import { fatalStartup } from './startup.ts'

const config = (() => {
  try {
    return loadConfig()
  } catch (e) {
    return fatalStartup(e)
  }
})()
const app = await createApp(config).catch(fatalStartup)

const server = Bun.serve({
  hostname: config.listen.host,
  port: config.listen.port,
  maxRequestBodySize: config.uploadCapBytes + 64 * 1024 * 1024,
  idleTimeout: 0,
  fetch: (request, srv) => app.fetch(request, { address: srv.requestIP(request)?.address ?? null }),
})
app.ctx.logger.info({ url: `http://${server.hostname}:${server.port}${config.basePath}`, runtime: `bun ${Bun.version}` }, 'migrator listening')

// The pre-flight checks run once the server answers; failing ones are logged with their fix.
void logPreflight(config, app.ctx.logger).catch((e) => app.ctx.logger.warn({ err: e }, 'pre-flight checks failed to run'))

let stopping = false
async function shutdown(signal: string) {
  if (stopping) return
  stopping = true
  app.ctx.logger.info({ signal }, 'shutting down')
  app.ctx.hub.closeAll()
  await server.stop(false)
  await app.close()
  process.exit(0)
}
process.on('SIGINT', () => void shutdown('SIGINT'))
process.on('SIGTERM', () => void shutdown('SIGTERM'))
