/**
 * After the boot: did the guest take the static addresses its configuration gives a carried
 * interface (docs/network-identity.md)? Checked from the host with an ARP probe on the bridge the
 * NIC is attached to (`arping -D -c 1 -w 2 -I BRIDGE ADDR`, iputils: sender address 0.0.0.0, as
 * a duplicate-address probe, so the host needs no address on that network and no route changes);
 * the address counts as `seen` only when the reply comes from the NIC's MAC (another machine
 * holding the address answers with another MAC). Static IPv6 addresses are checked the same way by
 * neighbour discovery (`ndisc6 -1 ADDR BRIDGE`, Debian's `ndisc6`: a neighbour solicitation from the
 * bridge's link-local address, answered by a neighbour advertisement carrying the owner's MAC).
 * Tried every 2 s up to `waitSeconds`. A NIC on qemu user networking (no bridge) or a host without
 * `arping`/`ndisc6` is `not-checked`, with the reason.
 */
import { exec } from '../exec.ts'
import { sleep } from '../retry.ts'
import type { CarriedInterface } from '../job.ts'

/** Options: the bridge of each NIC by MAC (absent: user networking), how long to keep trying (s), cancellation, the arping and ndisc6 binaries. */
export interface AddressCheckOptions {
  bridgeOf: Map<string, string>
  waitSeconds: number
  signal?: AbortSignal
  arping?: string
  ndisc6?: string
}

/** The MACs that answered an `arping` run (`Unicast reply from A [MAC]`), lower-case. */
export function arpingReplies(output: string): string[] {
  return [...output.matchAll(/reply from \S+ \[([0-9a-fA-F:]{17})\]/g)].map((m) => m[1]!.toLowerCase())
}

/** The MACs that answered an `ndisc6` run (`Target link-layer address: MAC`), lower-case. */
export function ndiscReplies(output: string): string[] {
  return [...output.matchAll(/Target link-layer address:\s*([0-9a-fA-F:]{17})/g)].map((m) => m[1]!.toLowerCase())
}

/** The static addresses of a configured address list that the host can probe: IPv4, and IPv6 except link-local and multicast. */
export function probeableAddresses(addresses: string[]): Array<{ address: string; family: 4 | 6 }> {
  const out: Array<{ address: string; family: 4 | 6 }> = []
  for (const a of addresses) {
    const ip = a.split('/')[0]!
    if (/^\d{1,3}(\.\d{1,3}){3}$/.test(ip)) out.push({ address: ip, family: 4 })
    else if (/^[0-9a-f:]+$/i.test(ip) && ip.includes(':') && !/^(fe[89ab]|ff)/i.test(ip)) out.push({ address: ip.toLowerCase(), family: 6 })
  }
  return out
}

/**
 * Fills `address_check` and `address_evidence` of each interface: the static IPv4 addresses of
 * carried interfaces are probed with ARP (`arping -D`), the static IPv6 ones with a neighbour
 * solicitation (`ndisc6`, RFC 4861, from the bridge's link-local address); `seen` when every one
 * answered from the NIC's MAC, `not-seen` when one did not within `waitSeconds`; the others are
 * `not-checked` with why. Never throws.
 */
export async function checkAddresses(interfaces: CarriedInterface[], opts: AddressCheckOptions): Promise<void> {
  const deadline = Date.now() + opts.waitSeconds * 1000
  const arping = opts.arping ?? 'arping'
  const ndisc = opts.ndisc6 ?? 'ndisc6'
  for (const rec of interfaces) {
    const wanted = probeableAddresses(rec.addresses)
    const notChecked = (why: string) => Object.assign(rec, { address_check: 'not-checked', address_evidence: why })
    if (!rec.carried || !rec.mac) {
      notChecked('the interface was not carried over')
      continue
    }
    if (wanted.length === 0) {
      notChecked(rec.method === 'dhcp' ? 'the address comes from DHCP: nothing to compare' : 'no static IPv4 or global IPv6 address configured')
      continue
    }
    const bridge = opts.bridgeOf.get(rec.mac)
    if (!bridge) {
      notChecked('the NIC uses qemu user networking (no host bridge): the host cannot probe its address')
      continue
    }
    const seen = new Map<string, string>()
    const failed = new Map<string, string>()
    let others: string[] = []
    while (!opts.signal?.aborted) {
      for (const { address, family } of wanted) {
        if (seen.has(address) || failed.has(address)) continue
        const r =
          family === 4
            ? await exec(arping, ['-D', '-c', '1', '-w', '2', '-I', bridge, address], { timeoutMs: 10_000, env: { ...process.env, LC_ALL: 'C' } })
            : await exec(ndisc, ['-1', '-n', '-r', '1', '-w', '1500', address, bridge], { timeoutMs: 10_000, env: { ...process.env, LC_ALL: 'C' } })
        const tool = family === 4 ? arping : ndisc
        const probe = family === 4 ? 'ARP probe' : 'neighbour solicitation'
        if (r.spawnError) {
          failed.set(address, `${probe} on bridge ${bridge} failed: ${tool}: ${r.spawnError.message}`)
          continue
        }
        const macs = family === 4 ? arpingReplies(r.stdout) : ndiscReplies(r.stdout)
        if (macs.includes(rec.mac)) {
          seen.set(address, family === 4 ? 'an ARP probe' : 'a neighbour solicitation')
          continue
        }
        others = [...new Set([...others, ...macs])]
        // arping exits 2 when it failed itself (no such interface, no raw socket); ndisc6 prints
        // its own error (no IPv6 on the bridge, no raw socket) and exits 2 as well.
        if (r.code === 2) failed.set(address, `${probe} on bridge ${bridge} failed: ${(r.stderr || r.stdout).trim().split('\n').pop() || 'exit status 2'}`)
      }
      if (wanted.every((w) => seen.has(w.address) || failed.has(w.address)) || Date.now() >= deadline) break
      await sleep(2000)
    }
    const words = [...seen].map(([a, how]) => `${a} answered ${how} on bridge ${bridge} from MAC ${rec.mac}`)
    const missing = wanted.filter((w) => !seen.has(w.address) && !failed.has(w.address)).map((w) => w.address)
    const fails = [...failed].map(([a, why]) => `${a}: ${why}`)
    if (missing.length) {
      rec.address_check = 'not-seen'
      rec.address_evidence = [
        `no ${missing.map((a) => (a.includes(':') ? `neighbour advertisement for ${a}` : `ARP reply for ${a}`)).join(', ')} from MAC ${rec.mac} on bridge ${bridge} within ${opts.waitSeconds} s` +
          (others.length ? ` (answered by other MACs: ${others.join(', ')})` : ''),
        ...words,
        ...fails,
      ].join('; ')
    } else if (seen.size && !fails.length) {
      rec.address_check = 'seen'
      rec.address_evidence = words.join('; ')
    } else if (seen.size) {
      rec.address_check = 'seen'
      rec.address_evidence = [...words, ...fails].join('; ')
    } else {
      notChecked(fails.join('; '))
    }
  }
}
