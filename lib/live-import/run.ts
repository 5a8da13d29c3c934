/**
 * A live import (docs/live-import.md): the guest runs on this host while its disks copy.
 *
 * 1. Each source disk's reader is served read-only over NBD on a Unix socket in the job's private
 *    directory ({@link NbdExportServer}); a qcow2 overlay over each export is made beside it
 *    ({@link createOverlay}).
 * 2. `start` prepares and boots the guest on the overlays (the same hardware choice, network
 *    identity, UEFI loader and conversion as a normal import, written into the overlays, never
 *    the source) and runs the boot check; its verdict goes to `onStarted` while the copy goes on.
 * 3. As soon as the domain runs, a libvirt block copy per disk (lib/live-import/block-job.ts)
 *    fills the destination volume from the overlay and its export with synchronous writes, and
 *    pivots the guest onto it when in step: the same qemu process, the volume with no backing
 *    chain. A block job that vanishes (qemu lost the export while the worker was away) is started
 *    again, at most {@link MAX_JOB_STARTS} times per disk.
 * 4. Once every disk runs on its volume (live and persistent definitions checked), the exports
 *    stop and the overlays are removed.
 *
 * Resume: called again for a job whose guest runs already (`started` given), it serves the exports
 * on the same sockets (qemu reconnects on its next request; a guest paused by a read error while
 * they were away is resumed) and follows or restarts the block jobs.
 *
 * The guest stopping during the copy: when its qemu ended unasked (libvirt's `shut off (crashed)`)
 * it is started again on its overlays (what it wrote and flushed is there) and the block jobs with
 * it, at most {@link MAX_GUEST_RESTARTS} times; shut off for any other reason (its owner shut it
 * down, an operator destroyed it), it is started paused, so it never runs, its copy finished and
 * pivoted, and it is shut off again. libvirt out of reach past the client's reconnect window: the
 * import waits for it (the guest and its block jobs live in qemu), saying so through `onWaiting`.
 *
 * Cancel (`signal`) while the guest runs does what `cancelChoice` says: `finish` (the default) lets
 * the copy run to the pivot and returns as if no cancel came (the guest keeps running on its
 * volumes, with what it wrote); `destroy` (or a cancel before the guest runs) destroys it: block
 * jobs aborted, domain destroyed and undefined, overlays removed (the caller removes the volumes).
 * A `destroy` asked while a `finish` goes on still destroys.
 */
import { mkdir, readFile, rm, stat, writeFile } from 'node:fs/promises'
import * as path from 'node:path'
import type { DiskReader } from '../contracts/disk-reader.ts'
import type { DomainVolume } from '../domain/xml.ts'
import { libvirtMessage, type Virsh } from '../domain/virsh.ts'
import { MigError } from '../errors.ts'
import type { LiveGuestOnCancel } from '../job.ts'
import { sleep } from '../retry.ts'
import { type SpaceShortage, type SpaceWait, spaceWaitExpired, spaceWaitNotice } from '../pipeline/space-wait.ts'
import { abortBlockCopy, blockJobInfo, domainDisks, pivotBlockCopy, startBlockCopy } from './block-job.ts'
import { NbdExportServer } from './nbd-server.ts'
import { createOverlay } from './overlay.ts'

/** Starts of one disk's block job before the import fails (the first and the restarts). */
export const MAX_JOB_STARTS = 20

/**
 * Starts of a guest whose qemu ended unasked (`shut off (crashed)`: killed, crashed) during the
 * copy, before the import fails.
 */
export const MAX_GUEST_RESTARTS = 3

/**
 * Marker file in the job's directory, written when the guest was shut off during the copy for any
 * reason but a crash of its qemu (its owner shut it down, an operator destroyed it); its content is
 * libvirt's reason. It outlives the worker, so a resumed import keeps the guest off too.
 */
const KEPT_OFF = 'kept-off'

/** Longest Unix socket path (`sun_path` is 108 bytes with its terminating NUL). */
const MAX_SOCKET_PATH = 107

/** One disk of a live import. `capacity` bytes; `volumePath` the destination volume (`block`: a block device). */
export interface LiveImportDisk {
  label: string
  capacity: number
  volumePath: string
  block: boolean
}

/** What the guest's start reports (the orchestrator's `StartOutcome`). */
export interface LiveStartOutcome {
  domain: string
  hardware: unknown
  notice: string | null
  networkNotice?: string | null
}

/** Input of {@link runLiveImport}. */
export interface LiveImportInput {
  virsh: Virsh
  /** The job's private directory (sockets, overlays); made 0711 so qemu reaches its files. */
  dir: string
  disks: LiveImportDisk[]
  /** Opens the reader of disk `index` (closed here). */
  openReader(index: number): Promise<DiskReader>
  /** qemu's group: owner group of the sockets (null: root only). */
  qemuGid: number | null
  /**
   * Defines and starts the guest on `overlays` with the boot check; absent `started`: a fresh
   * import. A rejection fails the import (the domain is left as the start leaves it).
   */
  start(overlays: DomainVolume[], signal: AbortSignal): Promise<LiveStartOutcome>
  /** The guest of a resumed import, already started: its outcome as recorded. */
  started?: LiveStartOutcome
  /**
   * The job's domain name (reserved or defined), when not `started`: a domain of that name whose
   * disks are this import's overlays was started by a worker that died before it recorded the
   * start; it is followed, never started again (its overlays hold what the guest wrote).
   */
  domainName?: string | null
  /**
   * After a cancel (`signal` aborted): what to do with the running guest (read again while a
   * `finish` goes on, so a later `destroy` wins). Absent: `destroy`.
   */
  cancelChoice?(): Promise<LiveGuestOnCancel>
  /** A cancel came while the guest runs and its copy is being finished (called once). */
  onFinishing?(): void
  /** Called once the guest started (its boot verdict), before the copy ends. */
  onStarted(outcome: LiveStartOutcome): Promise<void>
  /** Bytes of disk `index` in the destination volume (from the block job's counters). */
  onProgress(index: number, doneBytes: number): void
  /**
   * The import waits (`message`) or goes on again (null): for the source (its reads fail), for
   * libvirt (out of reach past the client's reconnect window) or for space on the destination.
   */
  onWaiting(message: string | null, on: 'source' | 'libvirt' | 'space'): void
  /** Something happened to the running guest the operator must know (its qemu restarted, it was shut off). */
  onGuestNotice?(message: string): void
  /**
   * The destination filling up (file volumes): a block copy that stopped while the volume's file
   * system has less free than the rest of the disk needs waits for space, at most `seconds`
   * (`MIGRATOR_SPACE_WAIT_SECONDS`), looked at with `spaceOf`. Absent: no wait.
   */
  spaceWait?: Pick<SpaceWait, 'seconds' | 'spaceOf'>
  /** Bandwidth cap of each block job, bytes per second (null: none). */
  bytesPerSecond: number | null
  signal: AbortSignal
  /** Poll interval of the block jobs, ms (default 1000). */
  pollMs?: number
  log?(message: string, fields?: Record<string, unknown>): void
}

/** The overlay and socket paths of disk `index` in `dir`. */
export function livePaths(dir: string, index: number): { socket: string; overlay: string } {
  return { socket: path.join(dir, `${index}.sock`), overlay: path.join(dir, `${index}.qcow2`) }
}

function cancelled(): MigError {
  return new MigError('E_MIG_CANCELLED', 'cancelled by operator')
}

/**
 * Runs (or resumes) a live import to the end: the guest on its destination volumes. Returns the
 * start's outcome, its `notice` joined with what happened to the guest during the copy. Throws
 * `E_MIG_CANCELLED` (guest destroyed), `E_MIG_DISK_WRITE_FAILED` (block copy, no space after the
 * wait), `E_MIG_GUEST_BOOT_FAILED` (the guest gone, its qemu ending too often), the start's
 * errors, `E_MIG_INTERNAL` (socket path too long, export not served).
 */
export async function runLiveImport(input: LiveImportInput): Promise<LiveStartOutcome> {
  const { virsh, dir, disks, signal } = input
  const log = input.log ?? (() => {})
  await mkdir(dir, { recursive: true, mode: 0o711 })
  const servers: NbdExportServer[] = []
  const readers: DiskReader[] = []
  let guestStarted = !!input.started
  // The name the start defines (the job's reserved one): the copy starts once a domain of that
  // name runs with this import's overlays, while the boot check goes on.
  let domain: string | null = input.started?.domain ?? input.domainName ?? null
  let failing = 0
  // The start's boot check goes on after a cancel whose choice is `finish`: its own abort signal.
  const startAbort = new AbortController()
  // a cancel came and the guest runs: its copy is being finished
  let finishing = false
  // a cancel came that destroys the guest
  let destroying = false
  try {
    for (let i = 0; i < disks.length; i++) {
      const { socket } = livePaths(dir, i)
      if (socket.length > MAX_SOCKET_PATH)
        throw new MigError('E_MIG_INTERNAL', `live import: the socket path ${socket} is longer than ${MAX_SOCKET_PATH} bytes; use a shorter MIGRATOR_DATA_DIR`)
      const reader = await input.openReader(i)
      readers.push(reader)
      const server = new NbdExportServer({
        socketPath: socket,
        reader,
        label: disks[i]!.label,
        gid: input.qemuGid,
        onWaiting: (waiting, err) => {
          failing += waiting ? 1 : -1
          if (waiting && failing === 1) input.onWaiting(`waiting for the source: disk ${disks[i]!.label}: ${err?.message ?? 'reads fail'}`, 'source')
          if (!waiting && failing === 0) input.onWaiting(null, 'source')
        },
      })
      await server.listen()
      servers.push(server)
    }

    let started = input.started
    if (!started && input.domainName) {
      const listed = await domainDisks(virsh, input.domainName).catch(() => [])
      if (listed.some((d) => d.source.startsWith(`${dir}/`))) {
        log('live import: following the guest a previous worker started', { domain: input.domainName })
        started = {
          domain: input.domainName,
          hardware: null,
          notice: 'boot not verified: the boot check was interrupted (the worker restarted); the guest was started',
        }
        guestStarted = true
        domain = input.domainName
        await input.onStarted(started)
      }
    }
    // a cancel that reaches a job with no guest running yet (a resumed worker) starts nothing
    if (!started && signal.aborted) throw cancelled()
    let startDone: Promise<LiveStartOutcome>
    if (started) startDone = Promise.resolve(started)
    else {
      const overlays: DomainVolume[] = []
      for (let i = 0; i < disks.length; i++) {
        const p = livePaths(dir, i)
        await createOverlay(p.overlay, p.socket, disks[i]!.capacity)
        overlays.push({ label: disks[i]!.label, path: p.overlay, format: 'qcow2', stopOnError: true })
      }
      startDone = input.start(overlays, startAbort.signal).then(async (o) => {
        guestStarted = true
        domain = o.domain
        await input.onStarted(o)
        return o
      })
    }
    let outcome: LiveStartOutcome | null = null
    let startError: unknown = null
    startDone.then(
      (o) => (outcome = o),
      (e) => (startError = e ?? new Error('start failed')),
    )

    const starts = disks.map(() => 0)
    const pivoted = disks.map(() => false)
    const pollMs = input.pollMs ?? 1000
    let lastPaused = 0
    let restarts = 0
    const notices: string[] = []
    const notice = (message: string) => {
      notices.push(message)
      log(`live import: ${message}`, { domain })
      input.onGuestNotice?.(message)
    }
    // the guest was shut off by its owner during the copy: finished paused, left shut off
    const keptOffFile = path.join(dir, KEPT_OFF)
    let keptOff: string | null = await readFile(keptOffFile, 'utf8').catch(() => null)
    let libvirtAway = false
    // what a step throws when libvirt stayed away through the state read's reconnect window
    const libvirtAwayError = new MigError('E_MIG_GUEST_BOOT_FAILED', 'virsh domstate: no answer')
    // the last step began with the guest running or paused
    let stepSawActive = false
    // since when the destination has lacked space (null: it has not)
    let spaceShortSince: number | null = null

    /**
     * Whether disk `i`'s stopped block copy must wait for space: its volume's file system has less
     * free than the disk's capacity minus what the volume holds. Throws `E_MIG_DISK_WRITE_FAILED`
     * once it waited `spaceWait.seconds`.
     */
    const waitsForSpace = async (i: number): Promise<boolean> => {
      const d = disks[i]!
      const wait = input.spaceWait
      if (!wait || d.block) return false
      const held = await stat(d.volumePath)
        .then((x) => x.blocks * 512)
        .catch(() => 0)
      const needed = Math.max(0, d.capacity - held)
      const at = wait.spaceOf(d.volumePath)
      if (at.free >= needed) return false
      const shortage: SpaceShortage = {
        code: 'E_MIG_DISK_WRITE_FAILED',
        path: d.volumePath,
        needed,
        what: "the job's volumes",
        cause: new MigError(
          'E_MIG_DISK_WRITE_FAILED',
          `the block copy of disk ${d.label} stopped; the guest runs on, its writes kept in its overlay on this host`,
        ),
      }
      if (spaceShortSince === null) {
        spaceShortSince = Date.now()
        input.onWaiting(spaceWaitNotice(shortage, wait, at, spaceShortSince + wait.seconds * 1000, 'the block copy starts again by itself'), 'space')
      } else if (Date.now() - spaceShortSince >= wait.seconds * 1000) throw spaceWaitExpired(shortage, wait, at, { domain })
      return true
    }

    /** One look at the guest and its block jobs; true once every disk runs on its volume. */
    const step = async (): Promise<boolean> => {
      const name = outcome ? (outcome as LiveStartOutcome).domain : domain
      // The copy starts as soon as the guest runs, the boot check going on beside it.
      const st = name ? await virsh.stateOrAway(name) : { state: 'absent', reason: null }
      if (!st) throw libvirtAwayError
      // (a failure to list them is no "not ours": a cancel would destroy the guest)
      const listed = name && st.state !== 'absent' ? await domainDisks(virsh, name) : []
      // a domain of that name whose disks are not this import's is not the guest (yet)
      const ours = listed.some((e) => e.source.startsWith(`${dir}/`) || disks.some((d) => d.volumePath === e.source))
      // pmsuspended: the guest suspended itself to RAM; its qemu runs, and so do the block jobs
      const active = st.state === 'running' || st.state === 'paused' || st.state === 'pmsuspended'
      stepSawActive = active
      if (signal.aborted) {
        const choice = input.cancelChoice ? await input.cancelChoice().catch(() => 'finish' as const) : 'destroy'
        if (choice === 'destroy' || !(name && ours)) {
          destroying = true
          if (name && ours) {
            // a guest whose start (the boot check) has not returned yet is destroyed too
            guestStarted = true
            domain = name
          }
          startAbort.abort()
          throw cancelled()
        }
        if (!finishing) {
          finishing = true
          log('live import: cancel while the guest runs: its copy is finished', { domain: name })
          input.onFinishing?.()
        }
      }
      if (name && ours && st.state === 'shut off' && guestStarted && outcome) {
        domain = name
        if (st.reason === 'crashed' && !keptOff) {
          // qemu ended without the guest asking (killed, crashed): the guest starts again on its
          // overlays, which hold what it wrote; the block jobs start again with it
          if (restarts >= MAX_GUEST_RESTARTS)
            throw new MigError(
              'E_MIG_GUEST_BOOT_FAILED',
              `domain ${name}: its qemu ended ${restarts + 1} times during the live import; its writes are in ${dir}`,
              {
                details: { domain: name },
              },
            )
          restarts++
          await virsh.start(name)
          notice(
            `the guest's qemu ended (shut off: crashed) during the copy; the guest was started again on its disks here (${restarts} of at most ${MAX_GUEST_RESTARTS} restarts): what it had written and flushed is kept, unflushed writes are lost as in a power cut`,
          )
          return false
        }
        if (!keptOff) {
          keptOff = st.reason ?? 'unknown'
          await writeFile(keptOffFile, keptOff)
          notice(
            `the guest was shut off (${keptOff}) during the copy; its copy is finished with the guest started paused, and it is left shut off (virsh start ${name} starts it)`,
          )
        }
        // started paused, it never runs: the block jobs need a qemu process
        const r = await virsh.run(['start', '--paused', '--domain', name], 120_000)
        if (r.code !== 0 && !/already active/i.test(r.stderr))
          throw new MigError('E_MIG_GUEST_BOOT_FAILED', `domain ${name}: starting it paused to finish its copy failed: ${libvirtMessage(r)}`, {
            details: { domain: name },
          })
        return false
      }
      if (name && ours && active) {
        domain = name
        guestStarted = true
        if (
          st.state === 'paused' &&
          !keptOff &&
          spaceShortSince === null &&
          Date.now() - lastPaused > 5000 &&
          failing === 0 &&
          /I\/O error|ioerror/i.test(st.reason ?? '')
        ) {
          // paused by an I/O error (a read while the export was away, a write while the destination
          // was full: error policy stop): what failed is back
          lastPaused = Date.now()
          log('live import: resuming the guest paused by an I/O error', { domain: name })
          await virsh.run(['resume', '--domain', name])
        }
        for (let i = 0; i < disks.length; i++) {
          if (pivoted[i]) continue
          const d = disks[i]!
          const p = livePaths(dir, i)
          const entry = listed.find((e) => e.source === d.volumePath || e.source === p.overlay)
          if (!entry) throw new MigError('E_MIG_DISK_WRITE_FAILED', `domain ${name}: no disk on ${p.overlay} or ${d.volumePath}`)
          if (entry.source === d.volumePath) {
            pivoted[i] = true
            input.onProgress(i, d.capacity)
            continue
          }
          const info = await blockJobInfo(virsh, name, entry.target)
          if (!info) {
            if (starts[i]! > 0 && (await waitsForSpace(i))) continue
            if (spaceShortSince !== null) {
              spaceShortSince = null
              input.onWaiting(null, 'space')
            }
            if (starts[i]! >= MAX_JOB_STARTS)
              throw new MigError('E_MIG_DISK_WRITE_FAILED', `domain ${name} disk ${entry.target}: the block copy stopped ${MAX_JOB_STARTS} times`)
            starts[i]!++
            log('live import: starting the block copy', { domain: name, disk: entry.target, dest: d.volumePath, start: starts[i] })
            await startBlockCopy(virsh, name, entry.target, d.volumePath, { block: d.block, bytesPerSecond: input.bytesPerSecond })
            continue
          }
          input.onProgress(i, info.end > 0 ? Math.min(d.capacity, Math.floor((info.cur / info.end) * d.capacity)) : 0)
          if (info.end > 0 && info.cur >= info.end && (await pivotBlockCopy(virsh, name, entry.target))) {
            log('live import: pivoted onto the volume', { domain: name, disk: entry.target })
            pivoted[i] = true
            input.onProgress(i, d.capacity)
          }
        }
        return pivoted.every(Boolean) && !!outcome
      }
      // gone (undefined) or crashed and kept so (on_crash preserve): the import cannot go on; any
      // other state (`in shutdown`) is on its way to one handled above
      if (name && guestStarted && outcome && (st.state === 'absent' || st.state === 'crashed'))
        throw new MigError('E_MIG_GUEST_BOOT_FAILED', `domain ${name} is ${st.state} during the live import; its writes are in ${dir}`, {
          details: { domain: name },
        })
      return false
    }

    for (;;) {
      if (startError) throw startError
      try {
        if (await step()) break
        if (libvirtAway) {
          libvirtAway = false
          input.onWaiting(null, 'libvirt')
        }
      } catch (e) {
        if ((e instanceof MigError && e.code === 'E_MIG_CANCELLED') || !guestStarted || !domain) throw e
        // (read again unless the step's own read found libvirt away: a second reconnect window)
        const now = e === libvirtAwayError ? null : await virsh.stateOrAway(domain).catch(() => undefined)
        if (now) {
          // a guest that stopped while the step worked on it (a call on a domain no longer running
          // failed): the next step sees it shut off; any other failure is the import's
          if (!(stepSawActive && now.state === 'shut off')) throw e
          log('live import: the guest stopped during a step', { domain, error: (e as Error).message })
        } else if (now === undefined) throw e
        // libvirt away longer than the client's reconnect window (a restart, an upgrade): the guest
        // and its block jobs run in qemu without it; the import waits for it, never fails for it
        else if (!libvirtAway) {
          libvirtAway = true
          input.onWaiting(
            `waiting for libvirt at ${virsh.uri} (${(e as Error).message}); the guest and its block copies go on in qemu meanwhile; start libvirtd if it is stopped`,
            'libvirt',
          )
        }
      }
      await sleep(pollMs)
    }
    const name = (outcome as unknown as LiveStartOutcome).domain
    await renameInDescription(
      virsh,
      name,
      disks.map((d, i) => [livePaths(dir, i).overlay, d.volumePath]),
    )
    await checkNoOverlay(virsh, name, dir)
    // a guest shut off during the copy is shut off again (started paused, it never ran since)
    if (keptOff) await virsh.destroy(name)
    for (const s of servers) await s.close()
    await rm(dir, { recursive: true, force: true })
    const o = outcome as unknown as LiveStartOutcome
    const all = [o.notice, ...notices].filter((n): n is string => !!n)
    return { ...o, notice: all.length ? all.join('; ') : null }
  } catch (e) {
    if (destroying && guestStarted && domain) {
      // cancel with a guest running: it is destroyed with what it wrote
      for (const d of await domainDisks(virsh, domain).catch(() => [])) await abortBlockCopy(virsh, domain, d.target)
      await virsh.destroy(domain).catch(() => undefined)
      await virsh.undefine(domain).catch(() => undefined)
      await rm(dir, { recursive: true, force: true }).catch(() => {})
    } else if (!guestStarted) await rm(dir, { recursive: true, force: true }).catch(() => {})
    startAbort.abort()
    throw e
  } finally {
    for (const s of servers) await s.close()
    for (const r of readers) await r.close().catch(() => {})
  }
}

/**
 * Names the volumes in place of the overlays in the description of `name` (live and persistent:
 * the domain's description lists each disk's path). Throws `E_MIG_DISK_WRITE_FAILED`.
 */
async function renameInDescription(virsh: Virsh, name: string, renames: Array<[string, string]>): Promise<void> {
  const r = await virsh.run(['desc', '--domain', name])
  if (r.code !== 0) return
  let text = r.stdout.replace(/\n$/, '')
  for (const [from, to] of renames) text = text.split(from).join(to)
  if (text === r.stdout.replace(/\n$/, '')) return
  const w = await virsh.run(['desc', '--domain', name, '--live', '--config', '--new-desc', text])
  if (w.code !== 0) throw new MigError('E_MIG_DISK_WRITE_FAILED', `domain ${name}: updating its description failed: ${w.stderr.trim()}`)
}

/** Throws `E_MIG_DISK_WRITE_FAILED` when the live or persistent definition of `name` still names a file of `dir`. */
async function checkNoOverlay(virsh: Virsh, name: string, dir: string): Promise<void> {
  for (const args of [
    ['dumpxml', '--domain', name],
    ['dumpxml', '--inactive', '--domain', name],
  ]) {
    const r = await virsh.run(args)
    if (r.code !== 0) throw new MigError('E_MIG_DISK_WRITE_FAILED', `domain ${name}: ${args.join(' ')} failed: ${r.stderr.trim()}`)
    const line = r.stdout.split('\n').find((l) => l.includes(`${dir}/`))
    if (line)
      throw new MigError(
        'E_MIG_DISK_WRITE_FAILED',
        `domain ${name}: its ${args.includes('--inactive') ? 'persistent' : 'live'} definition still names the live-import directory: ${line.trim()}`,
      )
  }
}
