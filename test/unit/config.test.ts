/**
 * runtime/config.ts: the environment parsed with zod, one entry per variable. Malformed values
 * are named with their value and rule (all at once); empty means default; the resolved
 * configuration survives the JSON IPC to the workers unchanged.
 */
import { describe, expect, test } from 'bun:test'
import { loadConfig, skipGoShimVariable, VARIABLES } from '../../runtime/config.ts'

describe('configuration (zod)', () => {
  test('every malformed variable is named with its value and the rule, in one message', () => {
    let message = ''
    try {
      loadConfig({ MIGRATOR_SINK: 'nfs', MIGRATOR_MAX_JOBS: '0', MIGRATOR_LISTEN: 'nowhere', MIGRATOR_UPLOAD_CAP_BYTES: '1e9' })
    } catch (e) {
      message = (e as Error).message
    }
    expect(message).toContain('MIGRATOR_SINK="nfs" must be "file" or "zvol"')
    expect(message).toContain('MIGRATOR_MAX_JOBS="0" is not an integer >= 1')
    expect(message).toContain('MIGRATOR_LISTEN="nowhere" is not host:port')
    expect(message).toContain('MIGRATOR_UPLOAD_CAP_BYTES="1e9" is not an integer >= 1')
    expect(() => loadConfig({ MIGRATOR_LISTEN: '127.0.0.1:70000' })).toThrow('MIGRATOR_LISTEN="127.0.0.1:70000" is not host:port')
    expect(() => loadConfig({ MIGRATOR_BASIC_AUTH: 'nocolon' })).toThrow('MIGRATOR_BASIC_AUTH="nocolon" must be user:password')
    expect(() => loadConfig({ MIGRATOR_WARM_WORKER: 'yes' })).toThrow('MIGRATOR_WARM_WORKER="yes" must be 0 or 1')
  })

  test('empty is unset: the defaults apply', () => {
    const c = loadConfig({ MIGRATOR_DATA_DIR: '/srv/m', MIGRATOR_MAX_JOBS: '', MIGRATOR_SINK: '', MIGRATOR_LISTEN: '' })
    expect(c.maxJobs).toBe(2)
    expect(c.sink).toBe('file')
    expect(c.listen).toBeNull()
    expect(c.socket).toEqual({ path: '/run/migrator/api.sock', group: 'root' })
    expect(c.importRoot).toBe('/srv/m/imports')
    expect(c.qemuConf).toBe('/etc/libvirt/qemu.conf')
    expect(c.warmWorker).toBe(true)
    expect(loadConfig({ MIGRATOR_WARM_WORKER: '0' }).warmWorker).toBe(false)
    expect(loadConfig({ MIGRATOR_LISTEN: '[::1]:9000' }).listen).toEqual({ host: '::1', port: 9000 })
  })

  test('the resolved configuration is plain JSON data (what the supervisor sends its workers)', () => {
    const c = loadConfig({
      MIGRATOR_DATA_DIR: '/srv/m',
      MIGRATOR_BACKUP_URL: 'https://host',
      MIGRATOR_BOOT_SERIAL_PATTERN: 'login:',
      MIGRATOR_KEEP_ON_CANCEL: '1',
    })
    expect(JSON.parse(JSON.stringify(c))).toEqual(c)
    expect(c.keepOnCancel).toBe(true)
    expect(c.backup?.restorePointTimeoutSeconds).toBe(600)
  })

  test('one documented entry per variable; the Go-shim variable follows the appliance', () => {
    for (const [name, v] of Object.entries(VARIABLES)) {
      expect(name).toMatch(/^MIGRATOR_[A-Z0-9_]+$/)
      expect(v.doc.length).toBeGreaterThan(5)
    }
    expect(skipGoShimVariable('host-d')).toBe('HOST_D_MIGRATOR_SKIP_GO_SHIM')
  })
})
