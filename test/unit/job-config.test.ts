/**
 * The job-side configuration: defaults and validation of the engine's settings, and the sink a
 * job gets (file by default; zvol with the plan's `destination.pool` over MIGRATOR_ZFS_POOL).
 */
import { describe, expect, test } from 'bun:test'
import { FileSink } from '../../lib/sink/file.ts'
import type { ZvolSink } from '../../lib/sink/zvol.ts'
import { loadConfig } from '../../runtime/config.ts'
import { sinkFromConfig } from '../../lib/jobs/destination.ts'

const ID = '0f1e2d3c-4b5a-4697-8877-665544332211'

describe('job configuration', () => {
  test('engine defaults', () => {
    const c = loadConfig({ MIGRATOR_DATA_DIR: '/var/lib/migrator' })
    expect(c.supervisor).toEqual({ leaseSeconds: 30, heartbeatTimeoutSeconds: 20, maxAttempts: 3 })
    expect(c.copy).toEqual({ flushEveryBytes: 256 * 1024 * 1024, maxBytesPerSecond: 0, spaceWaitSeconds: 600, readRetrySeconds: 300 })
    expect(c.delta).toEqual({ convergeBelowBytes: 64 * 1024 * 1024, maxPasses: 8 })
    expect(c.domain.bootGraceSeconds).toBe(10)
    expect(c.domain.bootTimeoutSeconds).toBe(120)
    expect(c.domain.bootSerialPattern).toBeNull()
    expect(c.domain.defaultBridge).toBeNull()
    expect(c.v2v).toEqual({ virtioWinIso: '/usr/share/virtio-win/virtio-win.iso', binary: 'virt-v2v-in-place', fullImportBinary: 'virt-v2v' })
    expect(c.keepOnCancel).toBe(false)
    expect(c.backup).toBeNull()
    expect(c.guestShutdownTimeoutSeconds).toBe(300)
    expect(loadConfig({ MIGRATOR_GUEST_SHUTDOWN_TIMEOUT_SECONDS: '45' }).guestShutdownTimeoutSeconds).toBe(45)
  })

  test('malformed values name the variable', () => {
    expect(() => loadConfig({ MIGRATOR_DOMAIN_TYPE: 'xen' })).toThrow('MIGRATOR_DOMAIN_TYPE')
    expect(() => loadConfig({ MIGRATOR_BOOT_SERIAL_PATTERN: '([' })).toThrow('MIGRATOR_BOOT_SERIAL_PATTERN')
    expect(() => loadConfig({ MIGRATOR_FLUSH_EVERY_BYTES: '4096' })).toThrow('MIGRATOR_FLUSH_EVERY_BYTES')
    expect(() => loadConfig({ MIGRATOR_MAX_ATTEMPTS: '0' })).toThrow('MIGRATOR_MAX_ATTEMPTS')
    expect(() => loadConfig({ MIGRATOR_GUEST_SHUTDOWN_TIMEOUT_SECONDS: '0' })).toThrow('MIGRATOR_GUEST_SHUTDOWN_TIMEOUT_SECONDS')
  })

  test('the file sink by default; the zvol sink on MIGRATOR_ZFS_POOL, or on the plan destination pool', () => {
    expect(sinkFromConfig(loadConfig({ MIGRATOR_DATA_DIR: '/srv/m' }), 'ignored')).toBeInstanceOf(FileSink)
    const zc = loadConfig({ MIGRATOR_SINK: 'zvol', MIGRATOR_ZFS_POOL: 'tank', MIGRATOR_APPLIANCE: 'hostd' })
    expect((sinkFromConfig(zc) as ZvolSink).jobDataset(ID)).toBe(`tank/hostd/migrations/${ID}`)
    expect((sinkFromConfig(zc, 'fast/vms') as ZvolSink).jobDataset(ID)).toBe(`fast/vms/hostd/migrations/${ID}`)
  })
})
