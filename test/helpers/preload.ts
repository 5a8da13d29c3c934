/**
 * Preloaded by `bun test` (bunfig.toml): hooks here span the whole run, every file. libvirtd and
 * virtlogd, when a test file started them through `ensureLibvirt()`, are stopped once after the
 * last file, so no daemon outlives the run and no file pulls libvirt from under the next one.
 */
import { afterAll } from 'bun:test'
import { stopLibvirt } from './libvirt.ts'

afterAll(async () => {
  await stopLibvirt()
})
