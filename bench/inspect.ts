/**
 * Inspect benchmark (the rule: inspecting a 20 GiB sparse OVA reads only headers and
 * descriptors). Builds two OVAs around a 20 GiB virtual disk holding a few MiB of data, inspects
 * each with `inspectInput` (the code behind both inspect endpoints) in a child process, and prints
 * the wall time of the inspect, the bytes the inspecting process read (`rchar` of
 * `/proc/<child>/io`, sampled just before and just after the call, the child's modules already
 * loaded), the archive size, and the ratio bytes read / archive size.
 *
 * - `streamOptimized`: the 20 GiB sparse raw converted with `qemu-img convert -O vmdk -o
 *   subformat=streamOptimized` (a few MiB), an OVF 1.0 envelope and a SHA1 `.mf`, put in a tar
 *   with `tar --format=ustar` (`buildInput('ova_archive')` of `fixtures/inputs.ts`); and the
 *   same package without its `.mf` (inspect hashes files up to 64 MiB that the `.mf` lists, so
 *   the pair separates header reads from digest verification).
 * - `raw member`: the disk as a plain (flat/raw) 20 GiB tar member. `tar` would read the holes
 *   and write 20 GiB of zeros, so the archive is written by hand (POSIX pax: ustar headers, a pax
 *   `size=` record for the member over 8 GiB, the data at its 512-byte aligned offset, the rest a
 *   hole made by `ftruncate`), which keeps it sparse on disk. The `.mf` carries the SHA256 of the
 *   descriptor and of the 20 GiB member (hashed once while building; inspect defers digests of
 *   files over 64 MiB to the copy). `tar -tvf` lists it as a check.
 *
 *   ./node_modules/.bin/bun bench/inspect.ts [runs]   (default 3 runs per archive)
 * Needs qemu-utils and GNU tar; writes only to a temporary directory, removed at the end.
 */
import { execFileSync, spawn } from 'node:child_process'
import { closeSync, openSync, readFileSync, statSync, writeSync, ftruncateSync, mkdirSync } from 'node:fs'
import { createHash, randomBytes } from 'node:crypto'
import * as path from 'node:path'
import { createInterface } from 'node:readline'

const KiB = 1024
const MiB = 1024 * KiB
const GiB = 1024 * MiB
const DISK_BYTES = 20 * GiB
const fmt = (n: number) => n.toLocaleString('en-US')

// ---------------------------------------------------------------------------------------------
// Child: `bun bench/inspect.ts --child <archive> <importRoot>`. Loads every module inspect needs,
// says "ready", inspects on "go", prints the result, and exits on "exit".
if (process.argv[2] === '--child') {
  const [archive, importRoot] = [process.argv[3]!, process.argv[4]!]
  const { inspectInput } = await import('../lib/importers/index.ts')
  // The importer and the probe are imported lazily by inspectInput: load them before measuring.
  await import('../lib/importers/ova-archive.ts')
  await import('../lib/importers/probe.ts')
  const lines = createInterface({ input: process.stdin })
  const say = (o: unknown) => process.stdout.write(JSON.stringify(o) + '\n')
  say({ ready: true })
  for await (const line of lines) {
    if (line === 'go') {
      const t0 = performance.now()
      try {
        const r = await inspectInput(archive, { importRoot })
        const ms = performance.now() - t0
        say({
          ms,
          kind: r.detected_kind,
          disks: r.manifest.disks.map((d) => ({
            capacity: d.capacity_bytes,
            format: d.disk_format,
            offset: d.source.offset,
            length: d.source.length,
            digest: d.source.digest?.algorithm ?? null,
          })),
          warnings: r.manifest.warnings,
        })
      } catch (e) {
        say({ ms: performance.now() - t0, error: `${(e as { code?: string }).code ?? ''} ${(e as Error).message}` })
      }
    } else if (line === 'exit') break
  }
  process.exit(0)
}

// ---------------------------------------------------------------------------------------------
// Builders

/** Data spots of the disk: a header sector and 5 x ~1 MiB of random bytes scattered over 20 GiB. */
function dataSpots(): Array<{ at: number; bytes: Buffer }> {
  const spots = [{ at: 0, bytes: Buffer.concat([Buffer.from('MIGRATOR INSPECT BENCH DISK\n'), Buffer.alloc(512 - 28)]) }]
  for (const at of [1 * MiB, 3 * GiB + 12345 * 512, 7 * GiB, 13 * GiB + 4 * KiB, DISK_BYTES - 2 * MiB]) spots.push({ at, bytes: randomBytes(MiB + 4096) })
  return spots
}

/** Writes `spots` into `fd` at `base + spot.at`. */
function writeSpots(fd: number, base: number, spots: Array<{ at: number; bytes: Buffer }>): void {
  for (const s of spots) writeSync(fd, s.bytes, 0, s.bytes.length, base + s.at)
}

/** The 20 GiB sparse raw image (the source of the streamOptimized VMDK). */
function makeRaw(file: string, spots: Array<{ at: number; bytes: Buffer }>): void {
  const fd = openSync(file, 'w')
  try {
    writeSpots(fd, 0, spots)
    ftruncateSync(fd, DISK_BYTES)
  } finally {
    closeSync(fd)
  }
}

/**
 * SHA256 of the whole disk (zeros but the spots), computed from the spots in memory: reading the
 * 20 GiB of holes back through the kernel costs a minute of system time, hashing costs ~13 s.
 */
function diskSha256(spots: Array<{ at: number; bytes: Buffer }>): string {
  const h = createHash('sha256')
  const zeros = Buffer.alloc(4 * MiB)
  let pos = 0
  const zeroTo = (end: number) => {
    while (pos < end) {
      const n = Math.min(zeros.length, end - pos)
      h.update(n === zeros.length ? zeros : zeros.subarray(0, n))
      pos += n
    }
  }
  for (const s of [...spots].sort((a, b) => a.at - b.at)) {
    if (s.at < pos) throw new Error('overlapping data spots')
    zeroTo(s.at)
    h.update(s.bytes)
    pos += s.bytes.length
  }
  zeroTo(DISK_BYTES)
  return h.digest('hex')
}

/** One 512-byte ustar header (POSIX.1-2017 pax "ustar Interchange Format"). */
function ustarHeader(name: string, size: number, typeflag: string): Buffer {
  const h = Buffer.alloc(512)
  const put = (s: string, at: number, len: number) => h.write(s, at, len, 'latin1')
  const oct = (n: number, len: number) => n.toString(8).padStart(len - 1, '0') + '\0'
  if (Buffer.byteLength(name) > 100) throw new Error(`name too long for ustar: ${name}`)
  put(name, 0, 100)
  put(oct(0o644, 8), 100, 8)
  put(oct(0, 8), 108, 8)
  put(oct(0, 8), 116, 8)
  put(oct(size < 8 * GiB ? size : 0, 12), 124, 12) // over 8 GiB: the pax `size` record holds it
  put(oct(Math.floor(Date.now() / 1000), 12), 136, 12)
  put('        ', 148, 8)
  put(typeflag, 156, 1)
  put('ustar\0', 257, 6)
  put('00', 263, 2)
  let sum = 0
  for (const b of h) sum += b
  put(sum.toString(8).padStart(6, '0') + '\0 ', 148, 8)
  return h
}

/** A pax extended header record `"<len> <key>=<value>\n"` (the length counts itself). */
function paxRecord(key: string, value: string): string {
  const body = ` ${key}=${value}\n`
  let len = body.length + 1
  while (String(len).length + body.length !== len) len = String(len).length + body.length
  return `${len}${body}`
}

const pad512 = (n: number) => (512 - (n % 512)) % 512

function ovfEnvelope(name: string, diskHref: string, fileBytes: number, capacityBytes: number): string {
  return `<?xml version="1.0" encoding="UTF-8"?>
<Envelope xmlns="http://schemas.dmtf.org/ovf/envelope/1" xmlns:ovf="http://schemas.dmtf.org/ovf/envelope/1" xmlns:rasd="http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_ResourceAllocationSettingData" xmlns:vssd="http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_VirtualSystemSettingData" xmlns:vmw="http://www.vmware.com/schema/ovf">
  <References>
    <File ovf:href="${diskHref}" ovf:id="file1" ovf:size="${fileBytes}"/>
  </References>
  <DiskSection>
    <Info>Virtual disk information</Info>
    <Disk ovf:capacity="${capacityBytes / GiB}" ovf:capacityAllocationUnits="byte * 2^30" ovf:diskId="vmdisk1" ovf:fileRef="file1" ovf:format="https://www.qemu.org/docs/master/system/images.html#raw"/>
  </DiskSection>
  <VirtualSystem ovf:id="${name}">
    <Info>A virtual machine</Info>
    <Name>${name}</Name>
    <OperatingSystemSection ovf:id="101" vmw:osType="otherLinux64Guest"><Info>Guest OS</Info></OperatingSystemSection>
    <VirtualHardwareSection>
      <Info>Virtual hardware requirements</Info>
      <System><vssd:ElementName>Virtual Hardware Family</vssd:ElementName><vssd:InstanceID>0</vssd:InstanceID><vssd:VirtualSystemType>vmx-13</vssd:VirtualSystemType></System>
      <Item><rasd:ElementName>2 virtual CPU(s)</rasd:ElementName><rasd:InstanceID>1</rasd:InstanceID><rasd:ResourceType>3</rasd:ResourceType><rasd:VirtualQuantity>2</rasd:VirtualQuantity></Item>
      <Item><rasd:AllocationUnits>byte * 2^20</rasd:AllocationUnits><rasd:ElementName>2048MB of memory</rasd:ElementName><rasd:InstanceID>2</rasd:InstanceID><rasd:ResourceType>4</rasd:ResourceType><rasd:VirtualQuantity>2048</rasd:VirtualQuantity></Item>
      <Item><rasd:Address>0</rasd:Address><rasd:ElementName>SCSI controller 0</rasd:ElementName><rasd:InstanceID>3</rasd:InstanceID><rasd:ResourceSubType>lsilogic</rasd:ResourceSubType><rasd:ResourceType>6</rasd:ResourceType></Item>
      <Item><rasd:AddressOnParent>0</rasd:AddressOnParent><rasd:ElementName>Hard disk 1</rasd:ElementName><rasd:HostResource>ovf:/disk/vmdisk1</rasd:HostResource><rasd:InstanceID>4</rasd:InstanceID><rasd:Parent>3</rasd:Parent><rasd:ResourceType>17</rasd:ResourceType></Item>
      <vmw:Config ovf:required="false" vmw:key="firmware" vmw:value="bios"/>
    </VirtualHardwareSection>
  </VirtualSystem>
</Envelope>
`
}

/**
 * The raw-member OVA, written by hand: `<name>.ovf`, `<name>.mf`, then the 20 GiB disk member
 * (pax `x` header with its size, ustar header, data with holes), then two zero blocks.
 */
async function makeRawMemberOva(file: string, name: string, spots: Array<{ at: number; bytes: Buffer }>): Promise<void> {
  const diskName = `${name}-disk1.img`
  const ovf = Buffer.from(ovfEnvelope(name, diskName, DISK_BYTES, DISK_BYTES))
  // Layout first (the .mf size is fixed: two SHA256 lines), digests after the data is written.
  const mfLine = (n: string, hex: string) => `SHA256(${n})= ${hex}\n`
  const mfBytes = Buffer.byteLength(mfLine(`${name}.ovf`, '0'.repeat(64)) + mfLine(diskName, '0'.repeat(64)))
  const pax = Buffer.from(paxRecord('size', String(DISK_BYTES)) + paxRecord('path', diskName))
  let pos = 0
  const ovfAt = pos + 512
  pos = ovfAt + ovf.length + pad512(ovf.length)
  const mfAt = pos + 512
  pos = mfAt + mfBytes + pad512(mfBytes)
  const paxAt = pos
  pos = paxAt + 512 + pax.length + pad512(pax.length)
  const diskHeaderAt = pos
  const diskAt = diskHeaderAt + 512
  const end = diskAt + DISK_BYTES + pad512(DISK_BYTES) + 1024
  const fd = openSync(file, 'w')
  try {
    writeSync(fd, ustarHeader(`${name}.ovf`, ovf.length, '0'), 0, 512, ovfAt - 512)
    writeSync(fd, ovf, 0, ovf.length, ovfAt)
    writeSync(fd, ustarHeader('PaxHeaders/' + diskName.slice(0, 80), pax.length, 'x'), 0, 512, paxAt)
    writeSync(fd, pax, 0, pax.length, paxAt + 512)
    writeSync(fd, ustarHeader(diskName, DISK_BYTES, '0'), 0, 512, diskHeaderAt)
    writeSync(fd, ustarHeader(`${name}.mf`, mfBytes, '0'), 0, 512, mfAt - 512)
    writeSpots(fd, diskAt, spots)
    ftruncateSync(fd, end)
  } finally {
    closeSync(fd)
  }
  const ovfHex = createHash('sha256').update(ovf).digest('hex')
  const diskHex = diskSha256(spots)
  const mf = Buffer.from(mfLine(`${name}.ovf`, ovfHex) + mfLine(diskName, diskHex))
  if (mf.length !== mfBytes) throw new Error('manifest size changed')
  const fd2 = openSync(file, 'r+')
  try {
    writeSync(fd2, mf, 0, mf.length, mfAt)
  } finally {
    closeSync(fd2)
  }
}

// ---------------------------------------------------------------------------------------------
// Measuring

/** `rchar` and `read_bytes` of `/proc/<pid>/io`. */
function procIo(pid: number): { rchar: number; read_bytes: number } {
  const text = readFileSync(`/proc/${pid}/io`, 'utf8')
  const get = (k: string) => Number(new RegExp(`^${k}: (\\d+)$`, 'm').exec(text)?.[1] ?? NaN)
  return { rchar: get('rchar'), read_bytes: get('read_bytes') }
}

interface Run {
  ms: number
  rchar: number
  readBytes: number
  result: any
}

/** Starts a child on `archive`, measures one inspect, stops the child. */
async function inspectInChild(archive: string, importRoot: string): Promise<Run> {
  const child = spawn(process.execPath, [new URL(import.meta.url).pathname, '--child', archive, importRoot], { stdio: ['pipe', 'pipe', 'inherit'] })
  const lines = createInterface({ input: child.stdout! })[Symbol.asyncIterator]()
  const next = async () => {
    const r = await lines.next()
    if (r.done) throw new Error('inspect child exited early')
    return JSON.parse(r.value)
  }
  try {
    await next() // ready: modules loaded
    const before = procIo(child.pid!)
    child.stdin!.write('go\n')
    const result = await next()
    const after = procIo(child.pid!)
    child.stdin!.write('exit\n')
    await new Promise((r) => child.once('exit', r))
    return { ms: result.ms, rchar: after.rchar - before.rchar, readBytes: after.read_bytes - before.read_bytes, result }
  } catch (e) {
    child.kill('SIGKILL')
    throw e
  }
}

// ---------------------------------------------------------------------------------------------
// Main

const runs = Math.max(1, Number(process.argv[2] ?? 3))
const { tempDir } = await import('../test/helpers/tmp.ts')
const { buildInput } = await import('../fixtures/inputs.ts')
const t = tempDir('mig-bench-inspect-')
try {
  const importRoot = path.join(t.dir, 'imports')
  mkdirSync(importRoot, { recursive: true })
  const spots = dataSpots()
  const dataBytes = spots.reduce((s, x) => s + x.bytes.length, 0)
  console.log(`disk: ${fmt(DISK_BYTES)} bytes virtual (20 GiB), ${fmt(dataBytes)} bytes of data in ${spots.length} spots`)

  let t0 = performance.now()
  const raw = path.join(t.dir, 'disk.raw')
  makeRaw(raw, spots)
  const so = buildInput('ova_archive', importRoot, 'bench-so', [raw])
  console.log(`built streamOptimized OVA in ${fmt(Math.round(performance.now() - t0))} ms (qemu-img convert + tar)`)
  // The same package without its .mf: inspect then has no digest to verify.
  const staging = path.join(t.dir, 'so-members')
  mkdirSync(staging)
  execFileSync('tar', ['-xf', so.path, '-C', staging])
  const soNoMf = path.join(importRoot, 'bench-so-nomf.ova')
  execFileSync('tar', ['--format=ustar', '-cf', soNoMf, '-C', staging, 'bench-so.ovf', 'bench-so-disk1.vmdk'])
  t0 = performance.now()
  const flat = path.join(importRoot, 'bench-raw.ova')
  await makeRawMemberOva(flat, 'bench-raw', spots)
  console.log(`built raw-member OVA in ${fmt(Math.round(performance.now() - t0))} ms (hand-written pax tar; SHA256 of the 20 GiB member)`)
  console.log('tar -tvf of the raw-member OVA:')
  console.log(execFileSync('tar', ['-tvf', flat], { encoding: 'utf8' }).trimEnd().replace(/^/gm, '  '))
  console.log('')

  const variants = [
    ['streamOptimized VMDK member, with .mf (SHA1 of each file verified at inspect: files up to 64 MiB are hashed)', so.path],
    ['streamOptimized VMDK member, no .mf', soNoMf],
    ['raw 20 GiB member, with .mf (its SHA256 is deferred to the copy: over 64 MiB)', flat],
  ] as const
  for (const [label, archive] of variants) {
    const st = statSync(archive)
    const results: Run[] = []
    for (let i = 0; i < runs; i++) results.push(await inspectInChild(archive, importRoot))
    const r0 = results[0]!.result
    if (r0.error) throw new Error(`${label}: inspect failed: ${r0.error}`)
    console.log(`== ${label}: ${path.basename(archive)}`)
    console.log(`   archive size ${fmt(st.size)} bytes (${(st.size / GiB).toFixed(2)} GiB), ${fmt(st.blocks * 512)} bytes allocated on disk`)
    console.log(`   manifest: kind ${r0.kind}, disks ${JSON.stringify(r0.disks)}`)
    if (r0.warnings.length) console.log(`   warnings: ${r0.warnings.join(' | ')}`)
    for (const [i, r] of results.entries()) {
      console.log(
        `   run ${i + 1}: wall ${r.ms.toFixed(1)} ms, rchar ${fmt(r.rchar)} bytes, read_bytes ${fmt(r.readBytes)}, rchar / archive size ${(r.rchar / st.size).toExponential(2)}`,
      )
    }
    const best = results.reduce((a, b) => (b.ms < a.ms ? b : a))
    console.log(`   best: ${best.ms.toFixed(1)} ms; bytes read ${fmt(best.rchar)} = ${((best.rchar / st.size) * 100).toFixed(4)} % of the archive`)
    console.log('')
  }
} finally {
  t.cleanup()
}
