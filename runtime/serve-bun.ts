/**
 * Serves the migrator under Bun (`npm start`). Configuration from the environment (config.ts).
 * Listens on the unix socket (runtime/socket.ts; requests `via: 'socket'`) and, when
 * `MIGRATOR_LISTEN` is set, on TCP (`via: 'tcp'`: a credential is required, runtime/auth.ts).
 * `maxRequestBodySize` is set above the upload cap (Bun refuses bodies over 128 MiB otherwise);
 * the cap itself is enforced while streaming. SIGINT/SIGTERM shut down gracefully.
 */
import { createApp } from './app.ts'
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

const limits = { maxRequestBodySize: config.uploadCapBytes + 64 * 1024 * 1024, idleTimeout: 0 }
let socket: PendingSocket | null = null
let unixServer: ReturnType<typeof Bun.serve> | null = null
let server: ReturnType<typeof Bun.serve> | null = null
try {
  if (config.socket) {
    socket = await prepareSocket(config.socket.path, config.socket.group)
    // Bun's types leave idleTimeout out for unix sockets; it is passed all the same, since SSE
    // streams stay quiet longer than the default 10 s between heartbeats
    unixServer = Bun.serve({
      ...limits,
      unix: socket.bindPath,
      fetch: (request: Request) => app.fetch(request, { via: 'socket', address: null }),
    } as unknown as Parameters<typeof Bun.serve>[0])
    socket.publish()
    app.ctx.logger.info({ socket: socket.path, runtime: `bun ${Bun.version}` }, 'migrator listening')
  }
  if (config.listen) {
    server = Bun.serve({
      ...limits,
      hostname: config.listen.host,
      port: config.listen.port,
      fetch: (request, srv) => app.fetch(request, { via: 'tcp', address: srv.requestIP(request)?.address ?? null }),
    })
    app.ctx.logger.info({ url: `http://${server.hostname}:${server.port}${config.basePath}`, runtime: `bun ${Bun.version}` }, 'migrator listening')
  }
} catch (e) {
  socket?.remove()
  await app.close()
  fatalStartup(e)
}
process.stdout.write(consoleInstructions(config, app.ctx.paths.tokenFile, server?.port ?? null))

// The pre-flight checks run once the server answers; failing ones are logged with their fix.
void logPreflight(config, app.ctx.logger).catch((e) => app.ctx.logger.warn({ err: e }, 'pre-flight checks failed to run'))

let stopping = false
async function shutdown(signal: string) {
  if (stopping) return
  stopping = true
  app.ctx.logger.info({ signal }, 'shutting down')
  app.ctx.hub.closeAll()
  await server?.stop(false)
  await unixServer?.stop(false)
  socket?.remove()
  await app.close()
  process.exit(0)
}
process.on('SIGINT', () => void shutdown('SIGINT'))
process.on('SIGTERM', () => void shutdown('SIGTERM'))
