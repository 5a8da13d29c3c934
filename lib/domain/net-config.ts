/**
 * Parsers of a Linux guest's network configuration (docs/network-identity.md): what each
 * interface is bound to (its name and/or MAC address) and how it is configured (static addresses,
 * gateway, routes, DNS, or DHCP). Pure functions over file texts the inspection read from the guest
 * (lib/domain/inspect.ts); nothing here touches a disk.
 *
 * Styles and their sources:
 * - `ifupdown`: interfaces(5) of Debian's ifupdown: `iface NAME inet|inet6 METHOD` stanzas with
 *   `address` (CIDR, or with `netmask`), `gateway`, `dns-nameservers`, `up|post-up ip route add ...`;
 *   `source GLOB` and `source-directory DIR` name further files ({@link ifupdownIncludes}).
 * - `netplan`: netplan(5) YAML, `network.ethernets.<id>` with `match.macaddress`, `match.name`,
 *   `set-name`, `addresses`, `gateway4`/`gateway6`, `routes` (`to`, `via`), `nameservers.addresses`,
 *   `dhcp4`/`dhcp6`.
 * - `networkmanager`: nm-settings-keyfile(5): `[connection] interface-name`, `[ethernet]
 *   mac-address`, `[ipv4]`/`[ipv6]` `method`, `addressN=ADDR/PREFIX[,GW]`, `gateway`, `dns`
 *   (`;`-separated), `routeN=DEST/PREFIX[,NH]`.
 * - `ifcfg`: RHEL `/etc/sysconfig/network-scripts/ifcfg-*` (nm-settings-ifcfg-rh(5)): `DEVICE`,
 *   `HWADDR`, `BOOTPROTO`, `IPADDR[N]`, `PREFIX[N]`/`NETMASK[N]`, `GATEWAY`, `DNS1..`; `route-NAME`
 *   files are not read.
 * - `networkd`: systemd.network(5): `[Match] Name=`, `MACAddress=`; `[Network] Address=`,
 *   `Gateway=`, `DNS=`, `DHCP=`; `[Address] Address=`; `[Route] Destination=`, `Gateway=`.
 * Also the naming rules a guest may already carry: systemd.link(5) files (`[Match] MACAddress=`,
 * `[Link] Name=`) and udev's `70-persistent-net.rules` (`ATTR{address}=="MAC" ... NAME="eth0"`).
 *
 * What is not modelled: bonds, bridges and VLANs as such (their ports are reported when a stanza
 * names them), wireless, IPv6 router advertisements, `route-*` files of RHEL, ifupdown2's
 * templates. Malformed files yield what could be read plus a note; parsers never throw.
 */
import { parse as parseYaml } from 'yaml'
import { normalizeMac } from '../mac.ts'

/** The configuration systems the parsers read. */
export type NetConfigStyle = 'ifupdown' | 'netplan' | 'networkmanager' | 'ifcfg' | 'networkd'

/**
 * One interface a guest configures.
 * - `name`: the interface name the configuration binds to (null when it binds by MAC only);
 * - `mac`: the MAC it matches (lower-case `aa:bb:...`), or null;
 * - `method`: `static` (addresses given), `dhcp`, `manual` (up without an address: a bridge or
 *   bond port), `other` (loopback, ppp, anything else);
 * - `addresses`: CIDR strings (`192.0.2.10/24`, `2001:db8::10/64`); `gateway` (IPv4) and
 *   `gateway6` (IPv6); `routes` as `DEST via GW` (or `DEST`);
 *   `dns`: name servers;
 * - `file`: the guest path it came from.
 */
export interface ConfiguredInterface {
  style: NetConfigStyle
  file: string
  name: string | null
  mac: string | null
  method: 'static' | 'dhcp' | 'manual' | 'other'
  addresses: string[]
  gateway: string | null
  gateway6: string | null
  routes: string[]
  dns: string[]
}

/** A naming rule the guest already has: interface `name` for `mac` (a `.link` file or a udev rule). */
export interface NamingRule {
  file: string
  mac: string
  name: string
}

/** A guest file: its path in the guest and text. */
export interface GuestText {
  path: string
  text: string
}

function iface(style: NetConfigStyle, file: string, name: string | null): ConfiguredInterface {
  return { style, file, name, mac: null, method: 'other', addresses: [], gateway: null, gateway6: null, routes: [], dns: [] }
}

/** Keeps the first gateway of each family: an address with `:` is IPv6 (`gateway6`), else IPv4 (`gateway`). */
function setGateway(entry: ConfiguredInterface, gw: string | null | undefined): void {
  const g = gw?.trim()
  if (!g) return
  if (g.includes(':')) entry.gateway6 ??= g
  else entry.gateway ??= g
}

function pushUnique(list: string[], v: string | null | undefined): void {
  if (v && !list.includes(v)) list.push(v)
}

/** Prefix length of a dotted IPv4 netmask (`255.255.255.0` -> 24), or null when it is not one. */
export function prefixOfNetmask(mask: string): number | null {
  if (/^\d{1,3}$/.test(mask)) {
    const n = Number(mask)
    return n <= 32 ? n : null
  }
  const m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(mask.trim())
  if (!m) return null
  const bits = m
    .slice(1)
    .map((x) => Number(x).toString(2).padStart(8, '0'))
    .join('')
  if (!/^1*0*$/.test(bits) || bits.length !== 32) return null
  return bits.indexOf('0') === -1 ? 32 : bits.indexOf('0')
}

function withPrefix(addr: string, prefix: number | null): string {
  return addr.includes('/') || prefix === null ? addr : `${addr}/${prefix}`
}

/** Lines of a text with `#` comments and blank lines dropped, `\` continuations joined. */
function logicalLines(text: string): string[] {
  const out: string[] = []
  let cur = ''
  for (const raw of text.split('\n')) {
    const line = raw.replace(/\r$/, '')
    if (/^\s*#/.test(line)) continue
    if (line.endsWith('\\')) {
      cur += `${line.slice(0, -1)} `
      continue
    }
    const full = (cur + line).trim()
    cur = ''
    if (full) out.push(full)
  }
  if (cur.trim()) out.push(cur.trim())
  return out
}

/**
 * The files an interfaces(5) text pulls in: `source PATTERN` (a glob) and `source-directory DIR`
 * (every file of DIR whose name is made of letters, digits, `_` and `-`), relative paths taken
 * from `/etc/network`.
 */
export function ifupdownIncludes(text: string): Array<{ kind: 'glob' | 'dir'; path: string }> {
  const out: Array<{ kind: 'glob' | 'dir'; path: string }> = []
  for (const line of logicalLines(text)) {
    const m = /^(source|source-directory)\s+(\S+)/.exec(line)
    if (!m) continue
    const p = m[2]!.startsWith('/') ? m[2]! : `/etc/network/${m[2]}`
    out.push({ kind: m[1] === 'source' ? 'glob' : 'dir', path: p })
  }
  return out
}

/** Parses interfaces(5) files (the main file first, then what it sources). */
export function parseIfupdown(files: GuestText[]): ConfiguredInterface[] {
  const out: ConfiguredInterface[] = []
  const byName = new Map<string, ConfiguredInterface>()
  const ports = new Map<string, string>()
  for (const f of files) {
    let cur: ConfiguredInterface | null = null
    let pendingMask: string | null = null
    let inet6 = false
    const finish = () => {
      if (cur && pendingMask !== null) {
        // inet6 stanzas give `netmask` as a prefix length (interfaces(5)); inet ones dotted or as a length.
        const p = inet6 ? (/^\d{1,3}$/.test(pendingMask) && Number(pendingMask) <= 128 ? Number(pendingMask) : null) : prefixOfNetmask(pendingMask)
        cur.addresses = cur.addresses.map((a) => (a.includes(':') === inet6 ? withPrefix(a, p) : a))
      }
      pendingMask = null
    }
    for (const line of logicalLines(f.text)) {
      const words = line.split(/\s+/)
      const key = words[0]!
      if (key === 'iface') {
        finish()
        const name = words[1] ?? ''
        const method = words[3] ?? ''
        inet6 = words[2] === 'inet6'
        let entry = byName.get(name)
        if (!entry) {
          entry = iface('ifupdown', f.path, name)
          byName.set(name, entry)
          out.push(entry)
        }
        const m = method === 'static' ? 'static' : method === 'dhcp' || method === 'auto' ? 'dhcp' : method === 'manual' ? 'manual' : 'other'
        // An interface with a static family and a dhcp one is static for what must be kept.
        if (entry.method === 'other' || m === 'static' || (entry.method === 'manual' && m === 'dhcp')) entry.method = m
        cur = entry
        continue
      }
      if (/^(auto|allow-|mapping|source|rename)/.test(key)) {
        finish()
        cur = null
        continue
      }
      if (!cur) continue
      const val = words.slice(1).join(' ')
      if (key === 'address') pushUnique(cur.addresses, words[1])
      else if (key === 'netmask') pendingMask = words[1] ?? null
      else if (key === 'gateway') setGateway(cur, words[1])
      else if (key === 'dns-nameservers') for (const d of words.slice(1)) pushUnique(cur.dns, d)
      else if (key === 'hwaddress') cur.mac = normalizeMac(words[words.length - 1]) ?? cur.mac
      else if (/^(up|post-up|pre-up)$/.test(key)) {
        const r = /\broute\s+(?:add\s+)?(?:-net\s+)?(\S+)(?:\s+netmask\s+(\S+))?(?:.*?\b(?:via|gw)\s+(\S+))?/.exec(val)
        if (r && /^ip\s+(-\d\s+)?route\s+add|^route\s+add/.test(val)) {
          const dest = r[2] ? withPrefix(r[1]!, prefixOfNetmask(r[2])) : r[1]!
          pushUnique(cur.routes, r[3] ? `${dest} via ${r[3]}` : dest)
        }
      } else if (/^(bridge[-_]ports|bond[-_]slaves|vlan[-_]raw[-_]device)$/.test(key)) {
        for (const p of words.slice(1)) if (p !== 'none' && p !== 'all') ports.set(p, f.path)
      }
    }
    finish()
  }
  // Ports of bridges, bonds and VLANs are interfaces the configuration needs by name too.
  for (const [p, file] of ports) {
    if (byName.has(p)) continue
    const e = iface('ifupdown', file, p)
    e.method = 'manual'
    out.push(e)
  }
  return out.filter((e) => e.name !== 'lo' && e.method !== 'other')
}

function asList(v: unknown): unknown[] {
  return Array.isArray(v) ? v : v === undefined || v === null ? [] : [v]
}

/** Parses netplan YAML files (`network.ethernets`; bridges and bonds name their `interfaces`). */
export function parseNetplan(files: GuestText[]): ConfiguredInterface[] {
  const out: ConfiguredInterface[] = []
  for (const f of files) {
    let doc: unknown
    try {
      doc = parseYaml(f.text, { maxAliasCount: 100 })
    } catch {
      continue
    }
    const net = (doc as { network?: Record<string, unknown> } | null)?.network
    if (!net || typeof net !== 'object') continue
    const eths = (net.ethernets ?? {}) as Record<string, Record<string, unknown>>
    if (typeof eths !== 'object') continue
    for (const [id, e] of Object.entries(eths)) {
      if (!e || typeof e !== 'object') continue
      const match = (e.match ?? {}) as Record<string, unknown>
      const mac = typeof match.macaddress === 'string' ? normalizeMac(match.macaddress) : null
      const setName = typeof e['set-name'] === 'string' ? (e['set-name'] as string) : null
      const matchName = typeof match.name === 'string' && !/[*?[]/.test(match.name) ? (match.name as string) : null
      // Without a match section the id is the interface name (netplan(5)).
      const name = setName ?? matchName ?? (Object.keys(match).length === 0 ? id : null)
      const entry = iface('netplan', f.path, name)
      entry.mac = mac
      for (const a of asList(e.addresses))
        if (typeof a === 'string') pushUnique(entry.addresses, a)
        else if (a && typeof a === 'object') pushUnique(entry.addresses, Object.keys(a)[0])
      if (typeof e.gateway4 === 'string') setGateway(entry, e.gateway4)
      if (typeof e.gateway6 === 'string') setGateway(entry, e.gateway6)
      for (const r of asList(e.routes)) {
        if (!r || typeof r !== 'object') continue
        const { to, via } = r as { to?: unknown; via?: unknown }
        if (typeof to !== 'string') continue
        if ((to === 'default' || to === '0.0.0.0/0' || to === '::/0') && typeof via === 'string') setGateway(entry, via)
        else pushUnique(entry.routes, typeof via === 'string' ? `${to} via ${via}` : to)
      }
      const ns = (e.nameservers ?? {}) as { addresses?: unknown }
      for (const d of asList(ns.addresses)) if (typeof d === 'string') pushUnique(entry.dns, d)
      const dhcp = e.dhcp4 === true || e.dhcp4 === 'yes' || e.dhcp4 === 'true' || e.dhcp6 === true || e.dhcp6 === 'yes' || e.dhcp6 === 'true'
      entry.method = entry.addresses.length ? 'static' : dhcp ? 'dhcp' : 'manual'
      out.push(entry)
    }
    for (const kind of ['bridges', 'bonds']) {
      const group = (net[kind] ?? {}) as Record<string, Record<string, unknown>>
      if (!group || typeof group !== 'object') continue
      for (const v of Object.values(group)) {
        for (const p of asList(v?.interfaces)) {
          if (typeof p !== 'string' || out.some((o) => o.name === p || (o.name === null && eths[p]))) continue
          const e = iface('netplan', f.path, p)
          e.method = 'manual'
          out.push(e)
        }
      }
    }
  }
  return out
}

/** INI sections of a keyfile / unit file: `[name]` then `key=value` lines; repeated sections kept apart. */
export function iniSections(text: string): Array<{ name: string; values: Map<string, string[]> }> {
  const out: Array<{ name: string; values: Map<string, string[]> }> = []
  let cur: { name: string; values: Map<string, string[]> } | null = null
  for (const line of logicalLines(text)) {
    if (line.startsWith(';')) continue
    const s = /^\[([^\]]+)\]$/.exec(line)
    if (s) {
      cur = { name: s[1]!.trim(), values: new Map() }
      out.push(cur)
      continue
    }
    const kv = /^([^=]+?)\s*=\s*(.*)$/.exec(line)
    if (!kv || !cur) continue
    const k = kv[1]!.trim()
    const list = cur.values.get(k) ?? []
    list.push(kv[2]!.trim())
    cur.values.set(k, list)
  }
  return out
}

/** Parses NetworkManager keyfiles (`.nmconnection`); only `ethernet` (802-3-ethernet) connections. */
export function parseNmKeyfiles(files: GuestText[]): ConfiguredInterface[] {
  const out: ConfiguredInterface[] = []
  for (const f of files) {
    const secs = iniSections(f.text)
    const get = (sec: string, key: string) =>
      secs
        .find((s) => s.name === sec)
        ?.values.get(key)
        ?.at(-1) ?? null
    const type = get('connection', 'type')
    if (type !== 'ethernet' && type !== '802-3-ethernet') continue
    const entry = iface('networkmanager', f.path, get('connection', 'interface-name') || null)
    entry.mac = normalizeMac(get('ethernet', 'mac-address') ?? get('802-3-ethernet', 'mac-address'))
    let manual = false
    let auto = false
    for (const fam of ['ipv4', 'ipv6']) {
      const sec = secs.find((s) => s.name === fam)
      if (!sec) continue
      const method = sec.values.get('method')?.at(-1) ?? ''
      if (method === 'manual') manual = true
      if (method === 'auto' || method === 'dhcp') auto = true
      for (const [k, vs] of sec.values) {
        for (const v of vs) {
          if (/^address(es)?\d*$/.test(k)) {
            for (const part of v.split(';').filter(Boolean)) {
              const [addr, gw] = part.split(',')
              pushUnique(entry.addresses, addr?.trim())
              setGateway(entry, gw)
            }
          } else if (k === 'gateway') setGateway(entry, v)
          else if (k === 'dns') for (const d of v.split(/[;,]/).filter(Boolean)) pushUnique(entry.dns, d.trim())
          else if (/^routes?\d*$/.test(k)) {
            for (const part of v.split(';').filter(Boolean)) {
              const [dest, nh] = part.split(',')
              if (dest) pushUnique(entry.routes, nh ? `${dest.trim()} via ${nh.trim()}` : dest.trim())
            }
          }
        }
      }
    }
    entry.method = manual || entry.addresses.length ? 'static' : auto ? 'dhcp' : 'manual'
    out.push(entry)
  }
  return out
}

/** Shell-style `KEY=value` assignments of an ifcfg file (quotes removed). */
export function shellAssignments(text: string): Map<string, string> {
  const out = new Map<string, string>()
  for (const line of logicalLines(text)) {
    const m = /^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$/.exec(line)
    if (!m) continue
    let v = m[2]!.trim()
    const q = /^(["'])(.*)\1$/.exec(v)
    if (q) v = q[2]!
    else v = v.replace(/\s+#.*$/, '')
    out.set(m[1]!, v)
  }
  return out
}

/** Parses RHEL `ifcfg-*` files (Ethernet ones; `ifcfg-lo` skipped). */
export function parseIfcfg(files: GuestText[]): ConfiguredInterface[] {
  const out: ConfiguredInterface[] = []
  for (const f of files) {
    const v = shellAssignments(f.text)
    const fileName = f.path
      .split('/')
      .pop()!
      .replace(/^ifcfg-/, '')
    const type = (v.get('TYPE') ?? 'Ethernet').toLowerCase()
    if (fileName === 'lo' || (type !== 'ethernet' && !v.get('MASTER') && !v.get('BRIDGE'))) continue
    const entry = iface('ifcfg', f.path, v.get('DEVICE') || (v.get('HWADDR') ? null : fileName))
    entry.mac = normalizeMac(v.get('HWADDR'))
    for (const suffix of ['', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9']) {
      const addr = v.get(`IPADDR${suffix}`)
      if (!addr) continue
      const prefix = v.get(`PREFIX${suffix}`) ?? null
      const mask = v.get(`NETMASK${suffix}`) ?? null
      pushUnique(entry.addresses, withPrefix(addr, prefix !== null ? prefixOfNetmask(prefix) : mask !== null ? prefixOfNetmask(mask) : null))
    }
    const v6 = v.get('IPV6ADDR')
    if (v6) pushUnique(entry.addresses, v6)
    for (const a of (v.get('IPV6ADDR_SECONDARIES') ?? '').split(/\s+/)) pushUnique(entry.addresses, a)
    setGateway(entry, v.get('GATEWAY'))
    setGateway(entry, (v.get('IPV6_DEFAULTGW') ?? '').replace(/%.*$/, ''))
    for (let i = 1; i <= 9; i++) pushUnique(entry.dns, v.get(`DNS${i}`))
    const proto = (v.get('BOOTPROTO') ?? 'none').toLowerCase()
    entry.method = entry.addresses.length ? 'static' : proto === 'dhcp' || proto === 'bootp' ? 'dhcp' : 'manual'
    out.push(entry)
  }
  return out
}

/** Parses systemd-networkd `.network` files. */
export function parseNetworkd(files: GuestText[]): ConfiguredInterface[] {
  const out: ConfiguredInterface[] = []
  for (const f of files) {
    const secs = iniSections(f.text)
    const all = (sec: string, key: string) => secs.filter((s) => s.name === sec).flatMap((s) => s.values.get(key) ?? [])
    const names = all('Match', 'Name').flatMap((v) => v.split(/\s+/))
    const macs = all('Match', 'MACAddress').flatMap((v) => v.split(/\s+/))
    // Globs (`en*`) bind no particular interface: nothing of a name to keep.
    const name = names.length === 1 && !/[*?[!]/.test(names[0]!) ? names[0]! : null
    const mac = macs.length === 1 ? normalizeMac(macs[0]) : null
    if (name === null && mac === null) continue
    const entry = iface('networkd', f.path, name)
    entry.mac = mac
    for (const a of [...all('Network', 'Address'), ...all('Address', 'Address')]) for (const x of a.split(/\s+/)) pushUnique(entry.addresses, x)
    for (const g of all('Network', 'Gateway')) setGateway(entry, g)
    for (const d of all('Network', 'DNS')) for (const x of d.split(/\s+/)) pushUnique(entry.dns, x)
    for (const sec of secs.filter((s) => s.name === 'Route')) {
      const dest = sec.values.get('Destination')?.at(-1)
      const gw = sec.values.get('Gateway')?.at(-1)
      if (dest) pushUnique(entry.routes, gw ? `${dest} via ${gw}` : dest)
      else setGateway(entry, gw)
    }
    const dhcp = all('Network', 'DHCP').some((v) => /^(yes|true|ipv4|ipv6|1)$/i.test(v))
    entry.method = entry.addresses.length ? 'static' : dhcp ? 'dhcp' : 'manual'
    out.push(entry)
  }
  return out
}

/** Naming rules of systemd `.link` files: `[Match] MACAddress=` (one MAC) with `[Link] Name=`. */
export function parseLinkFiles(files: GuestText[]): NamingRule[] {
  const out: NamingRule[] = []
  for (const f of files) {
    const secs = iniSections(f.text)
    const macs = secs.filter((s) => s.name === 'Match').flatMap((s) => (s.values.get('MACAddress') ?? []).flatMap((v) => v.split(/\s+/)))
    const name = secs
      .find((s) => s.name === 'Link')
      ?.values.get('Name')
      ?.at(-1)
    const mac = macs.length === 1 ? normalizeMac(macs[0]) : null
    if (mac && name) out.push({ file: f.path, mac, name })
  }
  return out
}

/** Naming rules of udev rules files: a rule with `ATTR{address}=="MAC"` and `NAME="name"`. */
export function parseUdevNetRules(files: GuestText[]): NamingRule[] {
  const out: NamingRule[] = []
  for (const f of files) {
    for (const line of logicalLines(f.text)) {
      const mac = /ATTRS?\{address\}\s*==\s*"([^"]+)"/.exec(line)?.[1]
      const name = /(?:^|[,\s])NAME\s*:?=\s*"([^"]+)"/.exec(line)?.[1]
      const m = normalizeMac(mac)
      if (m && name) out.push({ file: f.path, mac: m, name })
    }
  }
  return out
}
