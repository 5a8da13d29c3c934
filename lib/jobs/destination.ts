/**
 * The job's destination systems from the settings: its sink (`file` or `zvol`) and its libvirt
 * client. Every step that writes volumes or talks to libvirt gets them from here.
 */
import type { StartBootCheck } from '../domain/start.ts'
import { Virsh } from '../domain/virsh.ts'
import { FileSink } from '../sink/file.ts'
import type { Sink } from '../sink/types.ts'
import { ZvolSink } from '../sink/zvol.ts'
import type { JobSettings } from './settings.ts'

/**
 * The destination sink the settings name; for the zvol sink, `pool` (the plan's
 * `destination.pool`) overrides `MIGRATOR_ZFS_POOL`. The file sink has no pool and ignores it.
 */
export function sinkFromConfig(settings: Pick<JobSettings, 'sink' | 'zfsPool' | 'appliance' | 'dataDir'>, pool?: string): Sink {
  return settings.sink === 'zvol'
    ? new ZvolSink({ pool: pool ?? settings.zfsPool, appliance: settings.appliance })
    : new FileSink({ dataDir: settings.dataDir })
}

/**
 * A libvirt client on the settings' URI; a call waits up to `libvirtReconnectSeconds` for
 * libvirtd to come back (a daemon restart) before it fails.
 */
export function virshOf(settings: Pick<JobSettings, 'libvirtUri' | 'libvirtReconnectSeconds'>): Virsh {
  return new Virsh({ uri: settings.libvirtUri, reconnectMs: settings.libvirtReconnectSeconds * 1000 })
}

/** The boot check's settings (lib/domain/boot-check.ts) for a started domain or a test boot. */
export function bootCheckOf(settings: Pick<JobSettings, 'domain'>): StartBootCheck {
  const d = settings.domain
  return {
    graceSeconds: d.bootGraceSeconds,
    timeoutSeconds: d.bootTimeoutSeconds,
    expectSerial: d.bootSerialPattern ? new RegExp(d.bootSerialPattern) : undefined,
  }
}
