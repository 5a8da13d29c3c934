/**
 * After the boot: did the guest take the addresses its configuration gives a carried interface
 * (docs/network-identity.md)? Checked from the host, cheaply, only where the host has a route to
 * the address through the bridge the NIC is attached to (`ip -o route get ADDR` naming that
 * bridge): one ICMP echo per try (`ping -c 1 -W 1 -I BRIDGE ADDR`), then the host's neighbour
 * table (`ip neigh show ADDR dev BRIDGE`) must hold the NIC's MAC for the address. The answer of
 * another machine with the address would carry another MAC and does not count.
 */
import { exec } from '../exec.ts'
import type { CarriedInterface } from './net-identity.ts'

/** Options: the bridge of each NIC by MAC (absent: user networking), how long to keep trying (s), cancellation. */
export interface AddressCheckOptions {
  bridgeOf: Map<string, string>
  waitSeconds: number
  signal?: AbortSignal
}

async function out(cmd: string, args: string[]): Promise<string> {
  const r = await exec(cmd, args, { timeoutMs: 10_000, env: { ...process.env, LC_ALL: 'C' } })
  return r.code === 0 ? r.stdout : ''
}

/**
 * Fills `address_check` and `address_evidence` of every carried interface with IPv4 static
 * addresses (others: `not-checked`, with why). Never throws.
 */
export async function checkAddresses(interfaces: CarriedInterface[], opts: AddressCheckOptions): Promise<void> {
  const deadline = Date.now() + opts.waitSeconds * 1000
  for (const rec of interfaces) {
    const v4 = rec.addresses.map((a) => a.split('/')[0]!).filter((a) => /^\d{1,3}(\.\d{1,3}){3}$/.test(a))
    if (!rec.carried || !rec.mac) {
      rec.address_check = 'not-checked'
      rec.address_evidence = 'the interface was not carried over'
      continue
    }
    if (v4.length === 0) {
      rec.address_check = 'not-checked'
      rec.address_evidence = rec.method === 'dhcp' ? 'the address comes from DHCP: nothing to compare' : 'no static IPv4 address configured'
      continue
    }
    const bridge = opts.bridgeOf.get(rec.mac)
    if (!bridge) {
      rec.address_check = 'not-checked'
      rec.address_evidence = 'the NIC uses qemu user networking (no host bridge): the host cannot see its traffic'
      continue
    }
    const routed: string[] = []
    for (const a of v4) if (new RegExp(`\\bdev ${bridge.replace(/[.]/g, '\\.')}\\b`).test(await out('ip', ['-o', 'route', 'get', a]))) routed.push(a)
    if (routed.length === 0) {
      rec.address_check = 'not-checked'
      rec.address_evidence = `the host has no route to ${v4.join(', ')} through bridge ${bridge} (no host address on that network)`
      continue
    }
    let seen: string | null = null
    let last = ''
    while (!seen && !opts.signal?.aborted) {
      for (const a of routed) {
        await exec('ping', ['-n', '-q', '-c', '1', '-W', '1', '-I', bridge, a], { timeoutMs: 5000 })
        last = (await out('ip', ['neigh', 'show', a, 'dev', bridge])).trim()
        if (new RegExp(`lladdr ${rec.mac}\\b`, 'i').test(last)) {
          seen = a
          break
        }
      }
      if (seen || Date.now() >= deadline) break
      await new Promise((r) => setTimeout(r, 2000))
    }
    if (seen) {
      rec.address_check = 'seen'
      rec.address_evidence = `${seen} answered on bridge ${bridge} from MAC ${rec.mac} (host neighbour table)`
    } else {
      rec.address_check = 'not-seen'
      rec.address_evidence = `no answer from ${routed.join(', ')} with MAC ${rec.mac} on bridge ${bridge} within ${opts.waitSeconds} s${last ? ` (neighbour table: ${last})` : ''}`
    }
  }
}
