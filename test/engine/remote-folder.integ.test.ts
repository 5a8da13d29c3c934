/**
 * Remote folder exports (docs/remote-sources.md "Folder exports"): an `offline_url` naming an
 * `.ovf` descriptor or a `.vmx` file, its companions (disks, `.mf`) read as sibling URLs through
 * the same transport and credential (lib/remote/folder.ts). Against a real nginx and a real smbd
 * started by the test on 127.0.0.1: an OVF folder (OVF + two VMDKs + .mf) and a VMX folder
 * bit-exact over HTTP, the OVF folder over SMB; a hostile href (`..`, another host) rejected
 * naming it; a missing companion named by its URL.
 */
import { beforeAll, describe, expect, test } from 'bun:test'
import { cpSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { buildInput, fileSha256, makeRawImage, rawSha256 } from '../helpers/inputs.ts'
import { call, submit, volumePath, waitJob } from '../helpers/jobs.ts'
import { startNginx, type RunningNginx } from '../helpers/nginx.ts'
import { serverSuite } from '../helpers/server-suite.ts'
import { SMBD_USER, startSmbd, type RunningSmbd } from '../helpers/smbd.ts'

const PREFIX = 'migfold-'
const MiB = 1024 * 1024

describe('remote folder exports (real nginx and smbd, server, workers, file sink)', () => {
  let web: RunningNginx
  let smbd: RunningSmbd
  const { t, srv } = serverSuite({ prefix: PREFIX, tmpPrefix: 'mig-rfold-', env: { MIGRATOR_DOMAIN_TYPE: 'qemu' }, stop: (s) => [s, web, smbd] })
  const www = path.join(t.dir, 'www')
  const scratch = path.join(t.dir, 'scratch')
  let smbCredential = ''

  beforeAll(async () => {
    mkdirSync(www, { recursive: true })
    mkdirSync(scratch)
    mkdirSync(path.join(t.dir, 'imports'), { recursive: true })
    const raws = [makeRawImage(path.join(scratch, 'a.raw'), 48 * MiB, 5), makeRawImage(path.join(scratch, 'b.raw'), 32 * MiB, 6)]
    buildInput('ovf_folder', www, 'of', raws)
    buildInput('vmx_folder', www, 'vx', [raws[0]!])
    // hostile descriptors: a File href climbing out of the folder, one naming another host
    for (const [name, href] of [
      ['up', '../of/of-disk1.vmdk'],
      ['host', 'http://evil.example/x.vmdk'],
    ] as const) {
      mkdirSync(path.join(www, name))
      const ovf = readFileSync(path.join(www, 'of', 'of.ovf'), 'utf8').replaceAll('ovf:href="of-disk1.vmdk"', `ovf:href="${href}"`)
      writeFileSync(path.join(www, name, `${name}.ovf`), ovf)
    }
    // a descriptor whose second disk is not beside it
    mkdirSync(path.join(www, 'gap'))
    cpSync(path.join(www, 'of', 'of.ovf'), path.join(www, 'gap', 'of.ovf'))
    cpSync(path.join(www, 'of', 'of-disk1.vmdk'), path.join(www, 'gap', 'of-disk1.vmdk'))
    web = await startNginx(www, path.join(t.dir, 'nginx'))
    smbd = await startSmbd(www, path.join(t.dir, 'smbd'))
    smbCredential = (await call(srv.base, 'POST', '/remote-credentials', { name: 'share', kind: 'smb', ...SMBD_USER })).body.id
  }, 180_000)

  const plan = (kind: string, url: string, name: string, extra: Record<string, unknown> = {}) => ({
    source: { Offline: kind },
    source_ref: { kind: 'offline_url', url, ...extra },
    mode: 'Cold',
    name: `${PREFIX}${name}`,
    start: false,
  })
  /** Each disk of job `done` equals qemu-img convert of the local file `files[i]`. */
  const bitExact = (jobId: string, done: any, files: string[]) => {
    expect(done.progress.disks.length).toBe(files.length)
    for (const [i, d] of done.progress.disks.entries())
      expect(fileSha256(volumePath(t.dir, jobId, d.label))).toBe(rawSha256(path.join(www, files[i]!), 'vmdk', scratch))
  }

  test('an OVF folder over HTTP (descriptor URL): both disks and the .mf read as sibling URLs, bit-exact', async () => {
    const url = `${web.base}/of/of.ovf`
    const i = await call(srv.base, 'POST', '/remote-files/inspect', { url })
    expect([i.status, i.body.detected_kind, i.body.manifest?.disks.length]).toEqual([200, 'ovf_folder', 2])
    expect(i.body.manifest.warnings.join('\n')).not.toContain('no of.mf manifest')
    const job = await submit(srv.base, plan('ovf_folder', url, 'ovf'))
    const done = await waitJob(srv.base, job.id)
    expect([done.state, done.last_error]).toEqual(['Completed', null])
    bitExact(job.id, done, ['of/of-disk1.vmdk', 'of/of-disk2.vmdk'])
    const served = new Set(web.requests().map((r) => r.uri))
    for (const f of ['of.ovf', 'of.mf', 'of-disk1.vmdk', 'of-disk2.vmdk']) expect(served.has(`/of/${f}`)).toBe(true)
  }, 120_000)

  test('a VMX folder over HTTP (the .vmx URL): its monolithicSparse disk read beside it, bit-exact', async () => {
    const job = await submit(srv.base, plan('vmx_folder', `${web.base}/vx/vx.vmx`, 'vmx'))
    const done = await waitJob(srv.base, job.id)
    expect([done.state, done.last_error]).toEqual(['Completed', null])
    bitExact(job.id, done, ['vx/vx.vmdk'])
  }, 120_000)

  test('the OVF folder over SMB with an smb credential, bit-exact', async () => {
    const job = await submit(srv.base, plan('ovf_folder', `${smbd.base}/of/of.ovf`, 'smbovf', { credential_id: smbCredential }))
    const done = await waitJob(srv.base, job.id)
    expect([done.state, done.last_error]).toEqual(['Completed', null])
    bitExact(job.id, done, ['of/of-disk1.vmdk', 'of/of-disk2.vmdk'])
  }, 120_000)

  test('hostile hrefs (.., another host) are rejected naming them; a missing companion is E_MIG_NOT_FOUND naming its URL', async () => {
    const up = await call(srv.base, 'POST', '/remote-files/inspect', { url: `${web.base}/up/up.ovf` })
    expect([up.status, up.body.error.code]).toEqual([403, 'E_MIG_HOST_PATH_REJECTED'])
    expect(up.body.error.message).toContain('"../of/of-disk1.vmdk" rejected')
    const host = await call(srv.base, 'POST', '/remote-files/inspect', { url: `${web.base}/host/host.ovf` })
    expect(host.body.error.code).toBe('E_MIG_HOST_PATH_REJECTED')
    expect(host.body.error.message).toContain('"http://evil.example/x.vmdk" rejected')
    const job = await submit(srv.base, plan('ovf_folder', `${web.base}/gap/of.ovf`, 'gap'))
    const done = await waitJob(srv.base, job.id)
    expect([done.state, done.last_error.code]).toEqual(['Failed', 'E_MIG_NOT_FOUND'])
    expect(done.last_error.message).toContain(`${web.base}/gap/of-disk2.vmdk`)
  }, 120_000)
})
