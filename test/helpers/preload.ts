/**
 * Preloaded by `bun test` (bunfig.toml): hooks here span the whole run, every file. libvirtd and
 * virtlogd, when a test file started them through `ensureLibvirt()`, are stopped once after the
 * last file, so no daemon outlives the run and no file pulls libvirt from under the next one.
 *
 * `fetch` is wrapped so requests to a test server started by `startServer` carry that server's
 * API token (read from its own data directory) unless they set their own `Authorization`
 * (test/helpers/test-auth.ts; `rawFetch` goes without).
 */
import { afterAll } from 'bun:test'
import { stopLibvirt } from './libvirt.ts'
import { installAuthFetch } from './test-auth.ts'

installAuthFetch()

afterAll(async () => {
  await stopLibvirt()
})
