/**
 * After the boot: did the guest take the static addresses its configuration gives a carried
 * interface (docs/network-identity.md)? Checked from the host with an ARP probe on the bridge the
 * NIC is attached to (`arping -D -c 1 -w 2 -I BRIDGE ADDR`, iputils: sender address 0.0.0.0, as
 * a duplicate-address probe, so the host needs no address on that network and no route changes);
 * the address counts as `seen` only when the reply comes from the NIC's MAC (another machine
 * holding the address answers with another MAC). Tried every 2 s up to `waitSeconds`. A NIC on
 * qemu user networking (no bridge) or a host without `arping` is `not-checked`, with the reason.
 */
import { exec } from '../exec.ts'
import { sleep } from '../retry.ts'
import type { CarriedInterface } from '../job.ts'

/** Options: the bridge of each NIC by MAC (absent: user networking), how long to keep trying (s), cancellation, the arping binary. */
export interface AddressCheckOptions {
  bridgeOf: Map<string, string>
  waitSeconds: number
  signal?: AbortSignal
  arping?: string
}

/** The MACs that answered an `arping` run (`Unicast reply from A [MAC]`), lower-case. */
export function arpingReplies(output: string): string[] {
  return [...output.matchAll(/reply from \S+ \[([0-9a-fA-F:]{17})\]/g)].map((m) => m[1]!.toLowerCase())
}

/**
 * Fills `address_check` and `address_evidence` of each interface: carried interfaces with static
 * IPv4 addresses are probed; the others are `not-checked` with why. Never throws.
 */
export async function checkAddresses(interfaces: CarriedInterface[], opts: AddressCheckOptions): Promise<void> {
  const deadline = Date.now() + opts.waitSeconds * 1000
  const bin = opts.arping ?? 'arping'
  for (const rec of interfaces) {
    const v4 = rec.addresses.map((a) => a.split('/')[0]!).filter((a) => /^\d{1,3}(\.\d{1,3}){3}$/.test(a))
    const notChecked = (why: string) => Object.assign(rec, { address_check: 'not-checked', address_evidence: why })
    if (!rec.carried || !rec.mac) {
      notChecked('the interface was not carried over')
      continue
    }
    if (v4.length === 0) {
      notChecked(rec.method === 'dhcp' ? 'the address comes from DHCP: nothing to compare' : 'no static IPv4 address configured')
      continue
    }
    const bridge = opts.bridgeOf.get(rec.mac)
    if (!bridge) {
      notChecked('the NIC uses qemu user networking (no host bridge): the host cannot probe its address')
      continue
    }
    let seen: string | null = null
    let others: string[] = []
    let failure = ''
    while (!seen && !opts.signal?.aborted) {
      for (const a of v4) {
        const r = await exec(bin, ['-D', '-c', '1', '-w', '2', '-I', bridge, a], { timeoutMs: 10_000, env: { ...process.env, LC_ALL: 'C' } })
        if (r.spawnError) {
          failure = `${bin}: ${r.spawnError.message}`
          break
        }
        const macs = arpingReplies(r.stdout)
        if (macs.includes(rec.mac)) {
          seen = a
          break
        }
        others = [...new Set([...others, ...macs])]
        // Exit 2: arping itself failed (no such interface, no permission for a raw socket).
        if (r.code === 2) failure = (r.stderr || r.stdout).trim().split('\n').pop() ?? `exit status 2`
      }
      if (seen || failure || Date.now() >= deadline) break
      await sleep(2000)
    }
    if (seen) {
      rec.address_check = 'seen'
      rec.address_evidence = `${seen} answered an ARP probe on bridge ${bridge} from MAC ${rec.mac}`
    } else if (failure) {
      notChecked(`ARP probe on bridge ${bridge} failed: ${failure}`)
    } else {
      rec.address_check = 'not-seen'
      rec.address_evidence =
        `no ARP reply for ${v4.join(', ')} from MAC ${rec.mac} on bridge ${bridge} within ${opts.waitSeconds} s` +
        (others.length ? ` (answered by other MACs: ${others.join(', ')})` : '')
    }
  }
}
