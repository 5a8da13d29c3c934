/**
 * The set-up and tear-down a job suite shares, registered on the enclosing `describe`: a temporary
 * directory, libvirt up with no domain of the suite's prefix left, the suite's own inputs and
 * companions (`setUp`), one real migrator server, then what needs the server (`ready`); at the end
 * the server and the companions stopped, the suite's domains removed and the directory deleted.
 */
import { afterAll, afterEach, beforeAll } from 'bun:test'
import { chmodSync, rmSync } from 'node:fs'
import * as path from 'node:path'
import { cleanupDomains, ensureLibvirt, type Stoppable, tearDownJobs } from './libvirt.ts'
import { startServer, type RunningServer } from './server.ts'
import { tempDir } from './tmp.ts'

/**
 * The timeout of the clean-ups after each test and at the end: destroying a running domain and
 * stopping a server (SIGKILL after 10 s) outlast bun's default 5 s on a loaded host, and a hook
 * timed out makes bun kill the suite's processes, failing the tests after it.
 */
const HOOK_TIMEOUT_MS = 60_000

/**
 * A handle on an object made later (in a `beforeAll`): `handle` forwards every property read (and
 * `in`) to the object given to `set`, functions bound to it; before that it throws naming `what`.
 * `current` is the object itself, undefined until set.
 */
export function lateBound<T extends object>(what: string): { handle: T; set(value: T): void; readonly current: T | undefined } {
  let value: T | undefined
  const must = (): T => {
    if (value === undefined) throw new Error(`${what} is not there yet (its beforeAll has not run)`)
    return value
  }
  const handle = new Proxy({} as T, {
    get: (_, key) => {
      const target = must()
      const v = Reflect.get(target, key)
      return typeof v === 'function' ? v.bind(target) : v
    },
    has: (_, key) => Reflect.has(must(), key),
  })
  return {
    handle,
    set: (v) => {
      value = v
    },
    get current() {
      return value
    },
  }
}

/** What a suite states about its set-up; every hook runs inside the suite's `beforeAll`. */
export interface ServerSuiteOptions {
  /** Prefix of the suite's domain names: none left before, all removed after. */
  prefix: string
  /** Prefix of the temporary directory's name. */
  tmpPrefix: string
  /** The server's runtime (default `bun`). */
  runtime?: 'bun' | 'node'
  /** The server's data directory below the temporary directory (default: the directory itself). */
  dataSubdir?: string
  /** Mode 0755 on the temporary directory, so qemu reaches the file-sink volumes under it. */
  traversable?: boolean
  /** Before libvirt and the server: inputs, test doubles, companion servers. */
  setUp?: (dir: string) => unknown
  /** The server's environment (merged over the test process's), read after `setUp`. */
  env?: Record<string, string> | (() => Record<string, string>)
  /** After the server is up: credentials, sources, a browser. */
  ready?: (srv: RunningServer) => unknown
  /**
   * What the end stops, in order, given the server (undefined when it never started); default
   * the server alone.
   */
  stop?: (srv: RunningServer | undefined) => Array<Stoppable | null | undefined>
  /** After each test: the suite's domains and the destination volumes removed, passed or failed. */
  cleanEach?: boolean
  /** The `beforeAll` timeout in milliseconds (default 60 s). */
  timeoutMs?: number
}

/** A suite's temporary directory and its server (`srv`: usable from the suite's `beforeAll` on). */
export interface ServerSuite {
  t: { dir: string; cleanup(): void }
  srv: RunningServer
}

/**
 * Registers the suite's hooks (see the module comment) on the `describe` it is called in and
 * returns its directory and server. `srv` is a stable handle forwarding to the server started in
 * `beforeAll`; reading it earlier throws.
 */
export function serverSuite(o: ServerSuiteOptions): ServerSuite {
  const t = tempDir(o.tmpPrefix)
  const server = lateBound<RunningServer>(`the ${o.prefix} suite's server`)
  const srv = server.handle

  beforeAll(async () => {
    if (o.traversable) chmodSync(t.dir, 0o755)
    await o.setUp?.(t.dir)
    await ensureLibvirt()
    await cleanupDomains(o.prefix)
    const env = typeof o.env === 'function' ? o.env() : o.env
    server.set(await startServer(o.runtime ?? 'bun', o.dataSubdir ? path.join(t.dir, o.dataSubdir) : t.dir, env))
    await o.ready?.(srv)
  }, o.timeoutMs ?? 60_000)

  if (o.cleanEach)
    afterEach(async () => {
      await cleanupDomains(o.prefix)
      rmSync(path.join(t.dir, o.dataSubdir ?? '', 'volumes', 'migrations'), { recursive: true, force: true })
    }, HOOK_TIMEOUT_MS)

  afterAll(() => tearDownJobs(o.prefix, t, ...(o.stop ? o.stop(server.current) : [server.current])), HOOK_TIMEOUT_MS)
  return { t, srv }
}
