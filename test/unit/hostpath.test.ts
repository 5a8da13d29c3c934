import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { mkdirSync, symlinkSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { InputScope, remoteSibling, resolveInRoot } from '../../lib/hostpath.ts'
import { tempDir, thrown } from '../helpers/tmp.ts'

const t = tempDir()
const root = path.join(t.dir, 'imports')
const outside = path.join(t.dir, 'secret')

beforeAll(() => {
  mkdirSync(path.join(root, 'vms', 'a'), { recursive: true })
  mkdirSync(path.join(root, '.uploads'), { recursive: true })
  mkdirSync(outside, { recursive: true })
  writeFileSync(path.join(outside, 'passwd'), 'x')
  writeFileSync(path.join(root, 'vms', 'a', 'disk.qcow2'), 'x')
  symlinkSync(outside, path.join(root, 'link-dir-out'))
  symlinkSync(path.join(outside, 'passwd'), path.join(root, 'vms', 'link-file-out'))
  symlinkSync('../../../secret', path.join(root, 'vms', 'a', 'rel-link-out'))
  symlinkSync(path.join(root, 'vms', 'a'), path.join(root, 'link-in'))
})
afterAll(() => t.cleanup())

describe('import root confinement (spec 8)', () => {
  test('paths inside are resolved to absolute, symlink-free paths', () => {
    expect(resolveInRoot(root, 'vms/a/disk.qcow2')).toBe(path.join(root, 'vms', 'a', 'disk.qcow2'))
    expect(resolveInRoot(root, path.join(root, 'vms'))).toBe(path.join(root, 'vms'))
    expect(resolveInRoot(root, 'link-in/disk.qcow2')).toBe(path.join(root, 'vms', 'a', 'disk.qcow2'))
    expect(resolveInRoot(root, 'vms/./a/../a/new-file')).toBe(path.join(root, 'vms', 'a', 'new-file'))
    expect(resolveInRoot(root, 'disk.vmdk', { base: path.join(root, 'vms', 'a') })).toBe(path.join(root, 'vms', 'a', 'disk.vmdk'))
  })

  const attempts: Array<[string, string, object?]> = [
    ['dot-dot', '../secret/passwd'],
    ['deep dot-dot', 'vms/a/../../../secret/passwd'],
    ['absolute elsewhere', '/etc/passwd'],
    ['absolute prefix trick', root + '-evil/x'],
    ['symlinked directory out', 'link-dir-out/passwd'],
    ['symlinked file out', 'vms/link-file-out'],
    ['relative symlink out, nested', 'vms/a/rel-link-out/passwd'],
    ['percent-encoded dot-dot', '%2e%2e/secret/passwd'],
    ['percent-encoded slash', '..%2fsecret'],
    ['NUL byte', 'vms/a/disk.qcow2\0.txt'],
    ['uploads directory', '.uploads'],
    ['file in uploads', '.uploads/0b5e8f1c-0000-4000-8000-000000000000'],
    ['uploads via dot-dot', 'vms/../.uploads/x'],
    ['empty', ''],
    ['base escapes', '../../secret/passwd', { base: path.join(root, 'vms') }],
    ['overlong', 'a/'.repeat(3000)],
  ]
  for (const [name, p, opts] of attempts) {
    test(`rejects: ${name}`, async () => {
      const e = await thrown(() => resolveInRoot(root, p, opts))
      expect(e.code).toBe('E_MIG_HOST_PATH_REJECTED')
    })
  }

  test('.uploads is reachable only when allowed', () => {
    expect(resolveInRoot(root, '.uploads/x', { allowUploads: true })).toBe(path.join(root, '.uploads', 'x'))
  })
})

describe('remote folder exports: companion names (lib/hostpath.ts remoteSibling)', () => {
  const folder = 'smb://fs01:4450/exports/vm%201'
  test('a plain or nested name is the sibling URL, each segment percent-encoded', () => {
    expect(remoteSibling(folder, 'vm 1-disk1.vmdk')).toBe(`${folder}/vm%201-disk1.vmdk`)
    expect(remoteSibling(folder, 'disks/a#b?.vmdk')).toBe(`${folder}/disks/a%23b%3F.vmdk`)
  })
  test('hostile names are E_MIG_HOST_PATH_REJECTED naming them', async () => {
    for (const bad of [
      '../x.vmdk',
      'a/../../x.vmdk',
      '/etc/passwd',
      'http://evil.example/x.vmdk',
      'c:x.vmdk',
      'a\\..\\x',
      '%2e%2e/x',
      'a//b',
      './x',
      '',
      'x\u0000y',
    ])
      expect([bad, (await thrown(() => remoteSibling(folder, bad))).code]).toEqual([bad, 'E_MIG_HOST_PATH_REJECTED'])
  })
  test('resolveInRoot with a registered remote folder as base gives the sibling URL, never a host path', async () => {
    const scope = new InputScope(root)
    scope.addRemoteFolder(folder)
    try {
      expect(scope.run(() => resolveInRoot(root, 'd.vmdk', { base: folder }))).toBe(`${folder}/d.vmdk`)
      expect((await thrown(() => scope.run(() => resolveInRoot(root, '../../etc/passwd', { base: folder })))).code).toBe('E_MIG_HOST_PATH_REJECTED')
    } finally {
      scope.close()
    }
  })
})
