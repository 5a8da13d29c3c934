/**
 * Services that answer (docs/boot-check.md "Services that answer"): the plan's checks
 * (`plan.checks`, lib/plan.ts), run from this host after the boot against the guest's address on
 * the destination's network: a TCP connect to a port, or an HTTP(S) request expecting a status.
 *
 * Addresses, in this order ({@link checkTargets}): the static addresses the guest's configuration
 * gives its carried interfaces (those the address check saw first), then the DHCP leases libvirt
 * knows (`virsh domifaddr --source lease`, libvirt networks with DHCP), then the addresses of the
 * NICs' MACs in the host's neighbour table (`ip neigh`, filled by the address check's probes).
 * The host must reach that address: an address on the bridge's network, or a route to it.
 *
 * Each check is tried every 2 s on each address until one answers or `waitSeconds` pass (a
 * service can start after the boot check's evidence); each attempt is bounded by 5 s. HTTPS does
 * not verify the certificate (the check asks whether the service answers, not who it is: the
 * guest's certificate names its host, not the address tried). Never throws.
 */
import * as http from 'node:http'
import * as https from 'node:https'
import * as net from 'node:net'
import { exec } from '../exec.ts'
import { sleep } from '../retry.ts'
import type { ServiceCheckResult } from '../job.ts'
export type { ServiceCheckResult }

/**
 * One check of the plan: `name` (unique in the plan) and exactly one of `tcp: {port}` or
 * `http: {port, path, scheme, expect_status}` (defaults: port 80 for http, 443 for https, path
 * `/`, scheme `http`, status 200); `on_failure`: `fail` (default: the job fails with
 * `E_MIG_GUEST_BOOT_FAILED` naming the check) or `notice` (a non-fatal notice).
 */
export interface ServiceCheck {
  name: string
  tcp?: { port: number }
  http?: { port?: number; path?: string; scheme?: 'http' | 'https'; expect_status?: number }
  on_failure?: 'fail' | 'notice'
}

/** An address to run the checks against, and where it came from. */
export interface CheckTarget {
  address: string
  source: string
}

/** One attempt of a check on an address, bounded by `timeoutMs`: whether it passed and the result in words. */
export type CheckAttempt = (check: ServiceCheck, address: string, timeoutMs: number) => Promise<{ ok: boolean; result: string }>

/**
 * Options: how long to keep trying each check (s), cancellation, each attempt's limit (ms), and
 * `attempt`: where an attempt runs (default {@link attemptCheck}, from this host's network; a test
 * boot's runs in its isolated network, lib/domain/test-boot-network.ts).
 */
export interface ServiceCheckOptions {
  waitSeconds: number
  signal?: AbortSignal
  attemptTimeoutMs?: number
  attempt?: CheckAttempt
}

/**
 * A network the checks run from other than this host's (a test boot's isolated network): `where`
 * in words; `reach` makes the guest's static addresses (CIDR) reachable from it and returns notes on
 * those it could not; `attempt` runs one attempt there; `neighbours` is its `ip neigh` output.
 */
export interface CheckNetwork {
  where: string
  reach(addresses: string[]): Promise<string[]>
  attempt: CheckAttempt
  neighbours(): Promise<string>
}

const ATTEMPT_MS = 5000

function hostPart(address: string): string {
  return address.includes(':') ? `[${address}]` : address
}

/** The URL or `tcp host:port` a check tries on `address`. */
export function checkTarget(check: ServiceCheck, address: string): string {
  if (check.tcp) return `tcp ${hostPart(address)}:${check.tcp.port}`
  const h = check.http ?? {}
  const scheme = h.scheme ?? 'http'
  const port = h.port ?? (scheme === 'https' ? 443 : 80)
  return `${scheme}://${hostPart(address)}:${port}${h.path ?? '/'}`
}

function tcpAttempt(address: string, port: number, timeoutMs: number): Promise<{ ok: boolean; result: string }> {
  return new Promise((resolve) => {
    const sock = net.connect({ host: address, port })
    const done = (ok: boolean, result: string) => {
      clearTimeout(timer)
      sock.destroy()
      resolve({ ok, result })
    }
    const timer = setTimeout(() => done(false, `no answer within ${timeoutMs / 1000} s`), timeoutMs)
    sock.once('connect', () => done(true, 'connected'))
    sock.once('error', (e) => done(false, (e as NodeJS.ErrnoException).code ?? e.message))
  })
}

function httpAttempt(url: string, expect: number, timeoutMs: number): Promise<{ ok: boolean; result: string }> {
  return new Promise((resolve) => {
    const u = new URL(url)
    const mod = u.protocol === 'https:' ? https : http
    let settled = false
    const done = (ok: boolean, result: string) => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      req.destroy()
      resolve({ ok, result })
    }
    const req = mod.request(url, { method: 'GET', headers: { 'user-agent': 'vm-migrator-check' }, rejectUnauthorized: false, agent: false }, (res) => {
      res.resume()
      const status = res.statusCode ?? 0
      done(status === expect, `HTTP ${status}${status === expect ? '' : `, expected ${expect}`}`)
    })
    const timer = setTimeout(() => done(false, `no answer within ${timeoutMs / 1000} s`), timeoutMs)
    req.once('error', (e) => done(false, (e as NodeJS.ErrnoException).code ?? e.message))
    req.end()
  })
}

/** One attempt of `check` on `address`. */
export function attemptCheck(check: ServiceCheck, address: string, timeoutMs = ATTEMPT_MS): Promise<{ ok: boolean; result: string }> {
  if (check.tcp) return tcpAttempt(address, check.tcp.port, timeoutMs)
  return httpAttempt(checkTarget(check, address), check.http?.expect_status ?? 200, timeoutMs)
}

/**
 * Runs `checks` against `targets` (see the module comment); resolves with one result per check,
 * in the plan's order. With no target every check fails "no address of the guest is known".
 */
export async function runServiceChecks(checks: ServiceCheck[], targets: CheckTarget[], opts: ServiceCheckOptions): Promise<ServiceCheckResult[]> {
  const out: ServiceCheckResult[] = []
  for (const check of checks) {
    const t0 = Date.now()
    const kind = check.tcp ? 'tcp' : 'http'
    const base = { name: check.name, kind, on_failure: check.on_failure ?? 'fail' } as const
    if (targets.length === 0) {
      out.push({
        ...base,
        target: null,
        address: null,
        address_source: null,
        ok: false,
        result: 'no address of the guest is known (no static address, DHCP lease or neighbour entry)',
        at: new Date().toISOString(),
        seconds: 0,
        attempts: 0,
      })
      continue
    }
    const deadline = t0 + opts.waitSeconds * 1000
    let attempts = 0
    let last: { target: CheckTarget; result: string } | null = null
    let passed: { target: CheckTarget; result: string } | null = null
    while (!passed && !opts.signal?.aborted) {
      for (const target of targets) {
        attempts++
        const r = await (opts.attempt ?? attemptCheck)(check, target.address, opts.attemptTimeoutMs ?? ATTEMPT_MS)
        if (r.ok) {
          passed = { target, result: r.result }
          break
        }
        last = { target, result: r.result }
      }
      if (passed || Date.now() >= deadline) break
      await sleep(2000)
    }
    const at = passed ?? last!
    out.push({
      ...base,
      target: checkTarget(check, at.target.address),
      address: at.target.address,
      address_source: at.target.source,
      ok: !!passed,
      result: passed
        ? passed.result
        : opts.signal?.aborted
          ? 'cancelled'
          : `${last!.result} (${attempts} attempts in ${Math.round((Date.now() - t0) / 1000)} s)`,
      at: new Date().toISOString(),
      seconds: Math.round((Date.now() - t0) / 100) / 10,
      attempts,
    })
  }
  return out
}

/** The IPv4 and global IPv6 addresses of `virsh domifaddr --source lease` output for the MACs given (lower-case), with where from. */
export function parseDomifaddr(output: string, macs: Set<string>): CheckTarget[] {
  const out: CheckTarget[] = []
  for (const line of output.split('\n')) {
    const m = /^\s*\S+\s+([0-9a-f:]{17})\s+ipv[46]\s+(\S+?)(?:\/\d+)?\s*$/i.exec(line)
    if (m && macs.has(m[1]!.toLowerCase())) out.push({ address: m[2]!, source: 'dhcp lease' })
  }
  return out
}

/** The addresses of `ip neigh` output (both families) whose `lladdr` is one of `macs`, skipping link-local and failed entries. */
export function parseNeighbours(output: string, macs: Set<string>): CheckTarget[] {
  const out: CheckTarget[] = []
  for (const line of output.split('\n')) {
    const m = /^(\S+)\s+dev\s+(\S+)\s+lladdr\s+([0-9a-f:]{17})\s+(.*)$/i.exec(line.trim())
    if (!m || !macs.has(m[3]!.toLowerCase()) || /FAILED|INCOMPLETE/.test(m[4]!) || /^fe80:/i.test(m[1]!)) continue
    out.push({ address: m[1]!, source: `neighbour on ${m[2]}` })
  }
  return out
}

/**
 * The addresses to check, deduplicated, in the order of the module comment: `statics` (each
 * interface's configured addresses, seen ones first), then the DHCP leases libvirt knows of domain
 * `domain` for `macs`, then the neighbour table for `macs` (the host's, or `neighbours()`'s output
 * when the checks run from another network). `virshUri` is libvirt's URI.
 */
export async function checkTargets(
  statics: Array<{ name: string | null; addresses: string[]; seen: boolean }>,
  domain: string,
  macs: string[],
  virshUri: string,
  neighbours?: () => Promise<string>,
): Promise<CheckTarget[]> {
  const out: CheckTarget[] = []
  const add = (t: CheckTarget) => {
    if (!out.some((o) => o.address === t.address)) out.push(t)
  }
  for (const s of [...statics].sort((a, b) => Number(b.seen) - Number(a.seen)))
    for (const a of s.addresses) add({ address: a.split('/')[0]!, source: `static ${s.name ?? 'by MAC'}` })
  const wanted = new Set(macs.map((m) => m.toLowerCase()))
  if (wanted.size) {
    const leases = await exec('virsh', ['-c', virshUri, 'domifaddr', '--domain', domain, '--source', 'lease'], { timeoutMs: 15_000 })
    if (leases.code === 0) for (const t of parseDomifaddr(leases.stdout, wanted)) add(t)
    if (neighbours) for (const t of parseNeighbours(await neighbours(), wanted)) add(t)
    else {
      const neigh = await exec('ip', ['neigh', 'show'], { timeoutMs: 10_000 })
      if (neigh.code === 0) for (const t of parseNeighbours(neigh.stdout, wanted)) add(t)
    }
  }
  return out
}

/** What the failing checks mean for the job: the words of those that fail it and of those that only add a notice (null: none). */
export function checkVerdict(results: ServiceCheckResult[]): { failure: string | null; notice: string | null } {
  const words = (r: ServiceCheckResult) => `service check "${r.name}" failed: ${r.target ?? r.kind} ${r.result}`
  const fail = results.filter((r) => !r.ok && r.on_failure === 'fail').map(words)
  const notice = results.filter((r) => !r.ok && r.on_failure === 'notice').map(words)
  return { failure: fail.length ? fail.join('; ') : null, notice: notice.length ? notice.join('; ') : null }
}
