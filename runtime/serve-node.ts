/**
 * Serves the migrator under Node 20 (`npm run start:node`) through @whatwg-node/server and
 * `node:http`. Same configuration and shutdown behaviour as serve-bun.ts.
 */
import { createServer, type IncomingMessage } from 'node:http'
import { createServerAdapter } from '@whatwg-node/server'
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

const adapter = createServerAdapter<{ req: IncomingMessage }>((request: Request, context) =>
  app.fetch(request, { address: context.req?.socket?.remoteAddress ?? null }),
)
const server = createServer(adapter)
server.requestTimeout = 0
server.headersTimeout = 60_000
server.listen(config.listen.port, config.listen.host, () => {
  const addr = server.address()
  const port = typeof addr === 'object' && addr ? addr.port : config.listen.port
  app.ctx.logger.info({ url: `http://${config.listen.host}:${port}${config.basePath}`, runtime: `node ${process.version}` }, 'migrator listening')
})

// The pre-flight checks run once the server answers; failing ones are logged with their fix.
void logPreflight(config, app.ctx.logger).catch((e) => app.ctx.logger.warn({ err: e }, 'pre-flight checks failed to run'))

let stopping = false
async function shutdown(signal: string) {
  if (stopping) return
  stopping = true
  app.ctx.logger.info({ signal }, 'shutting down')
  app.ctx.hub.closeAll()
  // In-flight requests finish; connections that turn idle (keep-alive, ended SSE streams) are
  // closed as they do; whatever is still open after 15 s is cut.
  await new Promise<void>((resolve) => {
    const idle = setInterval(() => server.closeIdleConnections(), 100)
    const hard = setTimeout(() => server.closeAllConnections(), 15_000)
    server.close(() => {
      clearInterval(idle)
      clearTimeout(hard)
      resolve()
    })
    server.closeIdleConnections()
  })
  await app.close()
  process.exit(0)
}
process.on('SIGINT', () => void shutdown('SIGINT'))
process.on('SIGTERM', () => void shutdown('SIGTERM'))
