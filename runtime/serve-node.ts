/**
 * Serves the migrator under Node 20 (`npm run start:node`) through @whatwg-node/server and
 * `node:http`. Same listeners (unix socket, optional TCP), configuration and shutdown behaviour
 * as serve-bun.ts.
 */
import { createServer, type IncomingMessage, type Server } from 'node:http'
import { createServerAdapter } from '@whatwg-node/server'
import { createApp } from './app.ts'
import type { Via } from './auth.ts'
import { loadConfig } from './config.ts'
import { consoleInstructions } from './listen-info.ts'
import { prepareSocket, type PendingSocket } from './socket.ts'
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

function httpServer(via: Via): Server {
  const adapter = createServerAdapter<{ req: IncomingMessage }>((request: Request, context) =>
    app.fetch(request, { via, address: via === 'tcp' ? (context.req?.socket?.remoteAddress ?? null) : null }),
  )
  const server = createServer(adapter)
  server.requestTimeout = 0
  server.headersTimeout = 60_000
  return server
}

function listen(server: Server, ...args: [string] | [number, string]): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once('error', reject)
    server.listen(...(args as [number, string]), () => {
      server.off('error', reject)
      resolve()
    })
  })
}

const servers: Server[] = []
let socket: PendingSocket | null = null
let tcpPort: number | null = null
try {
  if (config.socket) {
    socket = await prepareSocket(config.socket.path, config.socket.group)
    const unixServer = httpServer('socket')
    await listen(unixServer, socket.bindPath)
    servers.push(unixServer)
    socket.publish()
    app.ctx.logger.info({ socket: socket.path, runtime: `node ${process.version}` }, 'migrator listening')
  }
  if (config.listen) {
    const server = httpServer('tcp')
    await listen(server, config.listen.port, config.listen.host)
    servers.push(server)
    const addr = server.address()
    tcpPort = typeof addr === 'object' && addr ? addr.port : config.listen.port
    app.ctx.logger.info({ url: `http://${config.listen.host}:${tcpPort}${config.basePath}`, runtime: `node ${process.version}` }, 'migrator listening')
  }
} catch (e) {
  socket?.remove()
  await app.close()
  fatalStartup(e)
}
process.stdout.write(consoleInstructions(config, app.ctx.paths.tokenFile, tcpPort))

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
  await Promise.all(
    servers.map(
      (server) =>
        new Promise<void>((resolve) => {
          const idle = setInterval(() => server.closeIdleConnections(), 100)
          const hard = setTimeout(() => server.closeAllConnections(), 15_000)
          server.close(() => {
            clearInterval(idle)
            clearTimeout(hard)
            resolve()
          })
          server.closeIdleConnections()
        }),
    ),
  )
  socket?.remove()
  await app.close()
  process.exit(0)
}
process.on('SIGINT', () => void shutdown('SIGINT'))
process.on('SIGTERM', () => void shutdown('SIGTERM'))
