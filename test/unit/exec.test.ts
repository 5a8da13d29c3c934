// lib/exec.ts: the one child-process runner (time limit, abort, stdout cap, stderr tail, process group).
import { describe, expect, test } from 'bun:test'
import { readFileSync } from 'node:fs'
import { Virsh } from '../../lib/domain/virsh.ts'
import { exec } from '../../lib/exec.ts'

/** A process that runs (a killed orphan may linger as a zombie until its new parent reaps it). */
const alive = (pid: number): boolean => {
  try {
    return !/^\d+ \(.*\) [ZX]/.test(readFileSync(`/proc/${pid}/stat`, 'utf8'))
  } catch {
    return false
  }
}

describe('exec', () => {
  test('exit status, stdout and stderr', async () => {
    const r = await exec('sh', ['-c', 'echo out; echo err >&2; exit 3'])
    expect(r).toMatchObject({ code: 3, signal: null, stdout: 'out\n', stderr: 'err\n', timedOut: false, aborted: false, overflow: false, spawnError: null })
  })

  test('a missing binary is a spawnError, never a rejection', async () => {
    const r = await exec('/nonexistent/i14-tool', [])
    expect(r.spawnError?.code).toBe('ENOENT')
    expect(r.code).toBeNull()
  })

  test('the time limit kills (SIGKILL at once by default, SIGTERM first with a grace)', async () => {
    const t0 = Date.now()
    const r = await exec('sleep', ['30'], { timeoutMs: 100 })
    expect(r).toMatchObject({ timedOut: true, signal: 'SIGKILL', code: null })
    const g = await exec('sleep', ['30'], { timeoutMs: 100, killGraceMs: 2000 })
    expect(g).toMatchObject({ timedOut: true, signal: 'SIGTERM' })
    expect(Date.now() - t0).toBeLessThan(10_000)
  })

  test('an abort signal stops it, also when already aborted', async () => {
    const ac = new AbortController()
    setTimeout(() => ac.abort(), 50)
    expect(await exec('sleep', ['30'], { signal: ac.signal })).toMatchObject({ aborted: true, timedOut: false })
    expect(await exec('sleep', ['30'], { signal: AbortSignal.abort() })).toMatchObject({ aborted: true })
  })

  test('stdout over the cap kills it; only the tail of stderr is kept', async () => {
    const r = await exec('sh', ['-c', 'yes | head -c 100000; sleep 30'], { maxStdout: 1000, timeoutMs: 20_000 })
    expect(r.overflow).toBe(true)
    expect(r.timedOut).toBe(false)
    expect(r.stdout.length).toBeLessThanOrEqual(1000)
    const e = await exec('sh', ['-c', 'printf "%05000d" 0 >&2; printf END >&2'], { stderrTail: 100 })
    expect(e.stderr.length).toBe(100)
    expect(e.stderr.endsWith('END')).toBe(true)
  })

  test('processGroup: what the tool leaves in its group is killed once it exits', async () => {
    const r = await exec('sh', ['-c', 'sleep 30 >/dev/null 2>&1 & echo $!'], { processGroup: true, timeoutMs: 20_000 })
    expect(r.code).toBe(0)
    const orphan = Number(r.stdout.trim())
    expect(orphan).toBeGreaterThan(0)
    for (let i = 0; i < 50 && alive(orphan); i++) await Bun.sleep(20)
    expect(alive(orphan)).toBe(false)
  })

  test('Virsh.run maps a run: exit status, a binary that cannot start (-1), the time limit', async () => {
    const ok = await new Virsh({ binary: 'echo', uri: 'test:///default' }).run(['list'])
    expect(ok).toEqual({ code: 0, stdout: '-c test:///default list\n', stderr: '', timedOut: false })
    const missing = await new Virsh({ binary: '/nonexistent/virsh' }).run(['list'])
    expect(missing.code).toBe(-1)
    expect(missing.stderr).toContain('/nonexistent/virsh')
    const slow = await new Virsh({ binary: 'sh', uri: 'exec sleep 30', timeoutMs: 100 }).run([])
    expect(slow).toMatchObject({ code: -1, timedOut: true })
  })

  test('input: written to stdin and closed; a child that does not read it still ends cleanly; without it stdin is empty', async () => {
    expect((await exec('cat', [], { input: 'hello\n' })).stdout).toBe('hello\n')
    const ignoring = await exec('true', [], { input: Buffer.alloc(4 * 1024 * 1024, 1), timeoutMs: 10_000 })
    expect([ignoring.code, ignoring.timedOut]).toEqual([0, false])
    expect((await exec('cat', [], { timeoutMs: 10_000 })).stdout).toBe('')
  })
})
