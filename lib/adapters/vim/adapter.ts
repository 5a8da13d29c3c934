/**
 * The `vim_api` live source adapter (spec 1.1, DESIGN.md section 7): vCenter or ESXi over the
 * vSphere Web Services SOAP API, natively in TypeScript (no VDDK, no Go shim).
 *
 * Control plane: connect (service content + login), list VMs (container view +
 * `RetrievePropertiesEx` paging), inspect into a manifest. Data plane: enable CBT
 * (`ReconfigVM_Task`), snapshots (`CreateSnapshot_Task` without memory, quiesced when VMware Tools
 * run), disk reads from the snapshot's own disk files over the datastore HTTP interface (never the
 * active disk of a running VM), `QueryChangedDiskAreas` paged from `startOffset + length` until
 * the capacity is covered, guest shutdown then power-off after a timeout, a mark in the VM's
 * annotation naming the destination host and job, and cleanup of every snapshot the migrator made.
 */
import { hostname } from 'node:os'
import { MigError, isMigError } from '../../errors.ts'
import { sleep } from '../../retry.ts'
import type { ManifestDisk, VmManifest } from '../../manifest.ts'
import type { DiskArea, DiskReader } from '../../contracts/disk-reader.ts'
import type { LiveSession, SnapshotRef, SourceAdapter, SourceConnection, VmSummary } from '../types.ts'
import { DatastoreHttp, openDatastoreVmdk } from './datastore.ts'
import { VM_PATHS, devicesOf, diskLabels, disksOf, manifestOf } from './manifest.ts'
import { TaskFailed, retrieveAll, retrieveOne, waitTask } from './props.ts'
import { VimClient, VimFault, arr, int, moref, txt, vimSdkUrl, x, type MoRef, type XNode } from './soap.ts'

/** Tunables of the adapter. Milliseconds. */
export interface VimAdapterOptions {
  /** How long a guest shutdown may take before the VM is powered off (default 300 000). */
  shutdownTimeoutMs?: number
  /** Power state polling interval while waiting for the guest to shut down (default 1 000). */
  pollMs?: number
  /** Per-request SOAP timeout (default 60 000). */
  requestTimeoutMs?: number
  /** How long a vSphere task (snapshot, reconfigure, power-off) may run (default 1 h). */
  taskTimeoutMs?: number
}

/** Prefix of every snapshot name the orchestrator gives (`migrator-<job>-<n>`); cleanup removes these. */
export const SNAPSHOT_PREFIX = 'migrator-'

const VM_ID = /^[A-Za-z0-9._:-]{1,128}$/

function vmRef(vmId: string): MoRef {
  if (!VM_ID.test(vmId)) throw new MigError('E_MIG_VM_NOT_FOUND', `no VM ${JSON.stringify(vmId.slice(0, 140))} on this source (not a managed object id)`)
  return { type: 'VirtualMachine', value: vmId }
}

function powerState(s: string | undefined): VmSummary['power_state'] {
  return s === 'poweredOn' ? 'on' : s === 'poweredOff' ? 'off' : s === 'suspended' ? 'suspended' : 'unknown'
}

/** A logged-in connection of the vim_api adapter; implements the whole {@link LiveSession}. */
export class VimSession implements LiveSession {
  private readonly labels = new Map<string, Map<number, string>>()
  private readonly dcPaths = new Map<string, string>()
  private readonly created = new Set<string>()

  constructor(
    /** The logged-in SOAP client (exposed for tests of login handling). */
    readonly client: VimClient,
    private readonly opts: Required<VimAdapterOptions>,
  ) {}

  supportsWarm(): boolean {
    return true
  }

  async describe(): Promise<{ product: string; version: string | null }> {
    const a = this.client.serviceContent.about
    return { product: a.fullName || a.name, version: a.version || null }
  }

  async listVms(): Promise<VmSummary[]> {
    const objs = await retrieveAll(this.client, 'VirtualMachine', [
      'name',
      'runtime.powerState',
      'config.guestId',
      'config.hardware.numCPU',
      'config.hardware.memoryMB',
      'config.template',
    ])
    return objs
      .filter((o) => txt(o.props['config.template']) !== 'true')
      .map((o) => {
        const mem = int(o.props['config.hardware.memoryMB'])
        return {
          vm_id: o.obj.value,
          name: txt(o.props.name) ?? o.obj.value,
          power_state: powerState(txt(o.props['runtime.powerState'])),
          guest_id: txt(o.props['config.guestId']) || null,
          cpu_count: int(o.props['config.hardware.numCPU']),
          memory_bytes: mem === null ? null : mem * 1024 * 1024,
        }
      })
      .sort((a, b) => a.name.localeCompare(b.name) || a.vm_id.localeCompare(b.vm_id))
  }

  private async vmProps(vmId: string, paths: readonly string[]): Promise<Record<string, XNode>> {
    const ref = vmRef(vmId)
    let props: Record<string, XNode>
    try {
      props = await retrieveOne(this.client, ref, [...new Set(['name', ...paths])])
    } catch (e) {
      if (e instanceof VimFault && e.faultType === 'ManagedObjectNotFound') throw new MigError('E_MIG_VM_NOT_FOUND', `no VM ${vmId} on ${this.client.sdkUrl}`)
      throw e
    }
    if (props.name === undefined) throw new MigError('E_MIG_VM_NOT_FOUND', `no VM ${vmId} on ${this.client.sdkUrl}`)
    return props
  }

  async inspect(vmId: string): Promise<VmManifest> {
    const props = await this.vmProps(vmId, VM_PATHS)
    this.labels.set(vmId, diskLabels(disksOf(devicesOf(props['config.hardware.device']))))
    return manifestOf(props)
  }

  private async labelsOf(vmId: string): Promise<Map<number, string>> {
    if (!this.labels.has(vmId)) await this.inspect(vmId)
    return this.labels.get(vmId)!
  }

  private async task(what: string, method: string, params: string): Promise<XNode> {
    const task = moref(await this.client.call(method, params))
    if (!task) throw new MigError('E_MIG_SOURCE_UNREACHABLE', `${what}: ${method} answered no task`)
    return (await waitTask(this.client, task, what, this.opts.taskTimeoutMs)).result
  }

  async enableCbt(vmId: string): Promise<void> {
    const props = await this.vmProps(vmId, ['config.changeTrackingEnabled'])
    if (txt(props['config.changeTrackingEnabled']) === 'true') return
    try {
      await this.task(`enable CBT on ${vmId}`, 'ReconfigVM_Task', x.ref('_this', vmRef(vmId)) + x.node('spec', [x.text('changeTrackingEnabled', true)]))
    } catch (e) {
      if (e instanceof TaskFailed || e instanceof VimFault)
        throw new MigError('E_MIG_CBT_UNSUPPORTED', `VM ${vmId}: changed block tracking cannot be enabled: ${e.message}`)
      throw e
    }
  }

  async createSnapshot(vmId: string, name: string): Promise<SnapshotRef> {
    const props = await this.vmProps(vmId, ['guest.toolsRunningStatus'])
    const quiesce = txt(props['guest.toolsRunningStatus']) === 'guestToolsRunning'
    const take = (q: boolean) =>
      this.task(
        `snapshot ${name} of ${vmId}`,
        'CreateSnapshot_Task',
        x.ref('_this', vmRef(vmId)) +
          x.text('name', name) +
          x.text('description', `taken by the VM migrator on ${hostname()}`) +
          x.text('memory', false) +
          x.text('quiesce', q),
      )
    let result: XNode
    try {
      try {
        result = await take(quiesce)
      } catch (e) {
        // A quiesced snapshot fails when the guest's VSS/sync driver does; fall back to crash-consistent.
        if (!quiesce || !(e instanceof TaskFailed)) throw e
        result = await take(false)
      }
    } catch (e) {
      if (e instanceof TaskFailed || e instanceof VimFault)
        throw new MigError('E_MIG_SNAPSHOT_FAILED', `VM ${vmId}: snapshot ${name} failed: ${e.message}`, { details: { vm_id: vmId } })
      throw e
    }
    const snap = moref(result)
    if (!snap) throw new MigError('E_MIG_SNAPSHOT_FAILED', `VM ${vmId}: snapshot ${name} finished without a snapshot reference`)
    this.created.add(snap.value)
    const labels = await this.labelsOf(vmId)
    const change_ids: Record<string, string> = {}
    for (const d of disksOf(devicesOf((await retrieveOne(this.client, snap, ['config.hardware.device']))['config.hardware.device']))) {
      const label = labels.get(d.key)
      if (label && d.changeId) change_ids[label] = d.changeId
    }
    return { id: snap.value, change_ids }
  }

  /** The inventory path of the datacenter holding `vmId` (`dcPath` of the datastore interface). */
  private async dcPath(vmId: string): Promise<string> {
    const cached = this.dcPaths.get(vmId)
    if (cached) return cached
    let ref: MoRef | null = vmRef(vmId)
    const names: string[] = []
    let inDc = false
    for (let i = 0; ref && i < 64; i++) {
      const p = await retrieveOne(this.client, ref, ['name', 'parent'])
      if (ref.type === 'Datacenter') inDc = true
      if (inDc) names.unshift(txt(p.name) ?? '')
      ref = moref(p.parent)
    }
    if (!inDc) throw new MigError('E_MIG_DISK_READ_FAILED', `VM ${vmId}: no datacenter above it in the inventory`)
    names.shift() // the root folder
    const path = names.join('/')
    this.dcPaths.set(vmId, path)
    return path
  }

  private async snapshotDisks(vmId: string, snapshot: SnapshotRef) {
    try {
      return disksOf(
        devicesOf(
          (await retrieveOne(this.client, { type: 'VirtualMachineSnapshot', value: snapshot.id }, ['config.hardware.device']))['config.hardware.device'],
        ),
      )
    } catch (e) {
      if (e instanceof VimFault) throw new MigError('E_MIG_DISK_READ_FAILED', `VM ${vmId}: snapshot ${snapshot.id} is gone: ${e.message}`)
      throw e
    }
  }

  async openDisk(vmId: string, snapshot: SnapshotRef, disk: ManifestDisk): Promise<DiskReader> {
    const key = disk.source.device_key
    const d = (await this.snapshotDisks(vmId, snapshot)).find((v) => v.key === key)
    if (!d) throw new MigError('E_MIG_DISK_READ_FAILED', `VM ${vmId}: snapshot ${snapshot.id} has no disk with device key ${key} (${disk.label})`)
    const http = new DatastoreHttp(this.client, await this.dcPath(vmId), this.opts.requestTimeoutMs * 2)
    try {
      return await openDatastoreVmdk(http, d.fileName, { label: disk.label, capacity: disk.capacity_bytes, parents: d.parents })
    } catch (e) {
      if (isMigError(e)) throw e
      throw new MigError('E_MIG_DISK_READ_FAILED', `${disk.label} (${d.fileName}): ${(e as Error).message}`, { cause: e })
    }
  }

  async changedAreas(vmId: string, snapshot: SnapshotRef, disk: ManifestDisk, sinceChangeId: string): Promise<DiskArea[]> {
    const key = disk.source.device_key
    if (key === undefined) throw new MigError('E_MIG_CBT_RESET', `${disk.label}: no device key to query changed areas of`)
    const capacity = (await this.snapshotDisks(vmId, snapshot)).find((v) => v.key === key)?.capacityBytes ?? disk.capacity_bytes
    const areas: DiskArea[] = []
    let start = 0
    for (let calls = 0; start < capacity; calls++) {
      if (calls > 1_000_000) throw new MigError('E_MIG_CBT_RESET', `${disk.label}: QueryChangedDiskAreas did not cover the disk`)
      let r: XNode
      try {
        r = await this.client.call(
          'QueryChangedDiskAreas',
          x.ref('_this', vmRef(vmId)) +
            x.ref('snapshot', { type: 'VirtualMachineSnapshot', value: snapshot.id }) +
            x.text('deviceKey', key) +
            x.text('startOffset', start) +
            x.text('changeId', sinceChangeId),
        )
      } catch (e) {
        if (e instanceof VimFault)
          throw new MigError('E_MIG_CBT_RESET', `${disk.label}: changed block tracking since ${sinceChangeId} is no longer valid: ${e.message}`, {
            details: { fault: e.faultType },
          })
        throw e
      }
      const s = int(r?.startOffset)
      const len = int(r?.length)
      if (s === null || len === null || s !== start || len <= 0)
        throw new MigError('E_MIG_CBT_RESET', `${disk.label}: QueryChangedDiskAreas answered window ${s}+${len} for offset ${start}`)
      for (const a of arr(r.changedArea)) {
        const o = int(a.start)
        const l = int(a.length)
        if (o === null || l === null || o < 0 || l <= 0 || o + l > capacity)
          throw new MigError('E_MIG_CBT_RESET', `${disk.label}: changed area ${o}+${l} lies outside the disk (${capacity} bytes)`)
        areas.push({ offset: o, length: l })
      }
      start = s + len
    }
    areas.sort((a, b) => a.offset - b.offset)
    const merged: DiskArea[] = []
    for (const a of areas) {
      const last = merged[merged.length - 1]
      if (last && a.offset <= last.offset + last.length) last.length = Math.max(last.length, a.offset + a.length - last.offset)
      else merged.push({ ...a })
    }
    return merged
  }

  async removeSnapshot(vmId: string, snapshot: SnapshotRef): Promise<void> {
    try {
      await this.task(
        `remove snapshot ${snapshot.id} of ${vmId}`,
        'RemoveSnapshot_Task',
        x.ref('_this', { type: 'VirtualMachineSnapshot', value: snapshot.id }) + x.text('removeChildren', false) + x.text('consolidate', true),
      )
    } catch (e) {
      if (e instanceof VimFault && e.faultType === 'ManagedObjectNotFound') return void this.created.delete(snapshot.id)
      if (e instanceof TaskFailed || e instanceof VimFault)
        throw new MigError('E_MIG_SNAPSHOT_FAILED', `VM ${vmId}: removing snapshot ${snapshot.id} failed: ${e.message}`)
      throw e
    }
    this.created.delete(snapshot.id)
  }

  async shutdown(vmId: string): Promise<boolean> {
    const state = async () => txt((await this.vmProps(vmId, ['runtime.powerState']))['runtime.powerState'])
    if ((await state()) === 'poweredOff') return false
    const ref = vmRef(vmId)
    let guestAsked = false
    try {
      await this.client.call('ShutdownGuest', x.ref('_this', ref))
      guestAsked = true
    } catch (e) {
      if (!(e instanceof VimFault)) throw e // ToolsUnavailable, InvalidPowerState (suspended): power off
    }
    if (guestAsked) {
      const deadline = Date.now() + this.opts.shutdownTimeoutMs
      while (Date.now() < deadline) {
        if ((await state()) === 'poweredOff') return true
        await sleep(this.opts.pollMs)
      }
      if ((await state()) === 'poweredOff') return true
    }
    try {
      await this.task(`power off ${vmId}`, 'PowerOffVM_Task', x.ref('_this', ref))
    } catch (e) {
      if ((e instanceof TaskFailed || e instanceof VimFault) && (await state()) === 'poweredOff') return true
      if (e instanceof TaskFailed || e instanceof VimFault) throw new MigError('E_MIG_INTERNAL', `VM ${vmId}: power off failed: ${e.message}`)
      throw e
    }
    return true
  }

  async powerOn(vmId: string): Promise<void> {
    const props = await this.vmProps(vmId, ['runtime.powerState'])
    if (txt(props['runtime.powerState']) === 'poweredOn') return
    try {
      await this.task(`power on ${vmId}`, 'PowerOnVM_Task', x.ref('_this', vmRef(vmId)))
    } catch (e) {
      if (e instanceof TaskFailed || e instanceof VimFault) throw new MigError('E_MIG_INTERNAL', `VM ${vmId}: power on failed: ${e.message}`)
      throw e
    }
  }

  async mark(vmId: string, note: string): Promise<void> {
    const props = await this.vmProps(vmId, ['config.annotation'])
    const kept = (txt(props['config.annotation']) ?? '')
      .split('\n')
      .filter((l) => !l.startsWith('migrator: '))
      .join('\n')
      .trimEnd()
    const line = `migrator: ${note.replace(/[\r\n]+/g, ' ').slice(0, 500)}; destination host ${hostname()}; ${new Date().toISOString()}`
    const annotation = (kept ? `${kept}\n${line}` : line).slice(-8192)
    try {
      await this.task(`mark ${vmId}`, 'ReconfigVM_Task', x.ref('_this', vmRef(vmId)) + x.node('spec', [x.text('annotation', annotation)]))
    } catch (e) {
      if (e instanceof TaskFailed || e instanceof VimFault) throw new MigError('E_MIG_INTERNAL', `VM ${vmId}: setting the migration mark failed: ${e.message}`)
      throw e
    }
  }

  async cleanup(vmId: string): Promise<void> {
    try {
      const props = await this.vmProps(vmId, ['snapshot'])
      const doomed: { ref: MoRef; depth: number }[] = []
      const walk = (list: XNode, depth: number) => {
        if (depth > 64) return
        for (const t of arr(list)) {
          const ref = moref(t.snapshot)
          const name = txt(t.name) ?? ''
          if (ref && (this.created.has(ref.value) || name.startsWith(SNAPSHOT_PREFIX))) doomed.push({ ref, depth })
          walk(t.childSnapshotList, depth + 1)
        }
      }
      walk(props.snapshot?.rootSnapshotList, 0)
      doomed.sort((a, b) => b.depth - a.depth)
      for (const d of doomed) await this.removeSnapshot(vmId, { id: d.ref.value, change_ids: {} }).catch(() => {})
    } catch {
      // never throws: the job's own outcome is what matters
    }
  }

  async close(): Promise<void> {
    await this.client.close()
  }
}

/**
 * Makes a `vim_api` adapter. `connect` validates the endpoint (`E_MIG_BAD_REQUEST`), fetches the
 * service content and logs in: `E_MIG_SOURCE_UNREACHABLE` (refused, DNS, TLS, timeout, not a
 * vSphere SDK), `E_MIG_AUTH_FAILED` (`InvalidLogin`).
 */
export function createVimAdapter(options: VimAdapterOptions = {}): SourceAdapter {
  const opts: Required<VimAdapterOptions> = {
    shutdownTimeoutMs: options.shutdownTimeoutMs ?? 300_000,
    pollMs: options.pollMs ?? 1000,
    requestTimeoutMs: options.requestTimeoutMs ?? 60_000,
    taskTimeoutMs: options.taskTimeoutMs ?? 3_600_000,
  }
  return {
    kind: 'vim_api',
    supportsWarm: () => true,
    async connect(conn: SourceConnection): Promise<VimSession> {
      const client = new VimClient({ sdkUrl: vimSdkUrl(conn.endpoint), tls: conn.tls ?? {}, timeoutMs: opts.requestTimeoutMs })
      try {
        await client.connect()
        await client.login(conn.username, conn.password)
      } catch (e) {
        await client.close()
        throw e
      }
      return new VimSession(client, conn.guestShutdownTimeoutMs === undefined ? opts : { ...opts, shutdownTimeoutMs: conn.guestShutdownTimeoutMs })
    },
  }
}
