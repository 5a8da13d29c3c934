/**
 * A wide-area link on this machine for the benchmarks: a network namespace of its own joined to
 * the host by a veth pair, so a server started in the namespace (`ip netns exec`) is reached
 * through a WAN's round trip and bandwidth:
 * - bandwidth: `tc qdisc ... tbf rate <rate>` on each end of the pair (iproute2);
 * - delay: a round trip of `2 x delayMs`. `tc netem delay` of `delayMs` on each end where the
 *   kernel has `sch_netem`; this machine's kernel has none (`CONFIG_NET_SCH_NETEM` unset), so a
 *   rule of the namespace's own netfilter (raw `PREROUTING`, not its loopback) sends every packet
 *   the namespace receives to an NFQUEUE queue, whose packets bench/net-delay.c holds the whole
 *   round trip from their arrival and then accepts in order. The whole delay is on the way in:
 *   held on the way out, a packet would still count against its sender's TCP small-queue budget
 *   (netem orphans the packets it delays; a queued packet is not), which throttles the sender to
 *   a few packets per delay; TCP's round trip and a request's latency are the same either way.
 * Everything is the link's own: a namespace and veth names of this process, a /30 of
 * 10.231.0.0/16 that no interface of the host uses, the rules inside the namespace (the host's
 * netfilter is not touched); `remove()` ends the delayer and deletes the namespace, which takes
 * the pair, its qdiscs and the rules with it.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process'
import * as path from 'node:path'

/** A shaped link: servers bind `nsAddr` inside the namespace `netns`; the host reaches them from `hostAddr`. */
export interface ShapedLink {
  netns: string
  hostAddr: string
  nsAddr: string
  /** How the link is shaped, for the report. */
  shape: string
  /** Ends the delayer, removes the namespace, the veth pair and their qdiscs; idempotent, never throws. */
  remove(): Promise<void>
}

const run = (cmd: string, ...args: string[]) => execFileSync(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] })

/** Whether the kernel has netem (a throwaway dummy-free probe: a qdisc on a veth of the link). */
function hasNetem(dev: string): boolean {
  try {
    run('tc', 'qdisc', 'add', 'dev', dev, 'root', 'netem', 'delay', '1ms')
    run('tc', 'qdisc', 'del', 'dev', dev, 'root')
    return true
  } catch {
    return false
  }
}

/**
 * Creates the link in `workDir` (the delayer's binary is built there): `delayMs` each way and
 * `rate` (tc's syntax, e.g. `1gbit`) on each end. Throws when `ip`, `tc`, `iptables` or the
 * delayer's build fails (what was created removed).
 */
export async function createShapedLink(workDir: string, delayMs = 10, rate = '1gbit'): Promise<ShapedLink> {
  const id = process.pid % 10_000
  const netns = `migbench-${id}`
  const inUse = execFileSync('ip', ['-o', 'addr'], { encoding: 'utf8' })
  let octet = id % 250
  while (inUse.includes(`10.231.${octet}.`)) octet = (octet + 1) % 250
  const hostAddr = `10.231.${octet}.1`
  const nsAddr = `10.231.${octet}.2`
  const hostIf = `mb${id}h`
  const nsIf = `mb${id}n`
  const inNs = (...args: string[]) => run('ip', 'netns', 'exec', netns, ...args)
  let delayer: ChildProcess | null = null
  let removed = false
  const remove = async () => {
    if (removed) return
    removed = true
    if (delayer && delayer.exitCode === null) {
      const gone = new Promise<void>((r) => delayer!.once('exit', () => r()))
      delayer.kill('SIGKILL')
      await gone
    }
    for (const args of [
      ['netns', 'del', netns],
      ['link', 'del', hostIf],
    ])
      try {
        run('ip', ...args)
      } catch {}
  }
  let shape: string
  try {
    run('ip', 'netns', 'add', netns)
    run('ip', 'link', 'add', hostIf, 'type', 'veth', 'peer', 'name', nsIf)
    run('ip', 'link', 'set', nsIf, 'netns', netns)
    run('ip', 'addr', 'add', `${hostAddr}/30`, 'dev', hostIf)
    run('ip', 'link', 'set', hostIf, 'up')
    inNs('ip', 'addr', 'add', `${nsAddr}/30`, 'dev', nsIf)
    inNs('ip', 'link', 'set', nsIf, 'up')
    inNs('ip', 'link', 'set', 'lo', 'up')
    if (hasNetem(hostIf)) {
      const netem = (dev: string) => ['tc', 'qdisc', 'add', 'dev', dev, 'root', 'netem', 'delay', `${delayMs}ms`, 'rate', rate, 'limit', '100000']
      run(...(netem(hostIf) as [string, ...string[]]))
      inNs(...netem(nsIf))
      shape = `tc netem delay ${delayMs}ms rate ${rate} on each end`
    } else {
      // a bucket of 1 MiB: above rate/HZ and a GSO packet, so the rate holds without dropping them
      const tbf = (dev: string) => ['tc', 'qdisc', 'add', 'dev', dev, 'root', 'tbf', 'rate', rate, 'burst', '1mb', 'latency', '100ms']
      run(...(tbf(hostIf) as [string, ...string[]]))
      inNs(...tbf(nsIf))
      const bin = path.join(workDir, 'net-delay')
      run('gcc', '-O2', '-o', bin, path.join(import.meta.dir, 'net-delay.c'), '-lnetfilter_queue', '-lnfnetlink')
      delayer = spawn('ip', ['netns', 'exec', netns, bin, '0', String(2 * delayMs * 1000)], { stdio: ['ignore', 'pipe', 'inherit'] })
      const d = delayer
      await new Promise<void>((resolve, reject) => {
        d.stdout!.on('data', (b) => String(b).includes('ready') && resolve())
        d.once('exit', (c) => reject(new Error(`net-delay exited with ${c}`)))
      })
      inNs('iptables', '-t', 'raw', '-A', 'PREROUTING', '!', '-i', 'lo', '-j', 'NFQUEUE', '--queue-num', '0')
      shape = `tc tbf rate ${rate} on each end, a ${2 * delayMs} ms round trip by bench/net-delay.c (NFQUEUE into the namespace; the kernel has no netem)`
    }
  } catch (e) {
    await remove()
    throw e
  }
  return { netns, hostAddr, nsAddr, shape, remove }
}
