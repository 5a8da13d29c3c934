/**
 * Network identity of a migrated Linux guest (docs/network-identity.md): the interfaces its
 * configuration names (lib/domain/net-config.ts) are matched to the NICs of the destination domain,
 * and each name the destination would not give by itself is pinned with a systemd.link(5) file
 * matching the NIC's MAC (which the domain keeps, lib/domain/xml.ts), so the unchanged
 * configuration (addresses, routes, DNS) applies to the same interface name.
 *
 * Why a name changes: VMware names a NIC after its PCI slot (`ens192`: `ethernet0.pciSlotNumber`
 * 192 through ACPI `_SUN`); on the destination's q35 machine the NIC sits behind a PCIe root port
 * and systemd names it `enp1s0` whatever its model. `ethN` names (net.ifnames=0, or udev's
 * persistent-net rules) follow probe order or a MAC rule.
 *
 * Matching, in this order, for an interface named N in the configuration:
 * 1. a naming rule the guest already has (`.link` file, persistent-net rule) that gives N to a MAC
 *    of a destination NIC: the guest keeps the name by itself (`how: 'guest-rule'`), nothing written;
 * 2. the configuration's own MAC match (netplan `match.macaddress`, NetworkManager `mac-address`,
 *    ifcfg `HWADDR`, networkd `MACAddress=`) -> that NIC;
 * 3. `ens<slot>` -> the NIC whose source PCI slot is `<slot>` (VMX `ethernetN.pciSlotNumber`);
 * 4. `eth<k>` -> the k-th NIC in source order;
 * 5. the only NIC of the VM, when the configuration names a single physical interface.
 * A configuration that binds by MAC only (no name) needs nothing but the MAC (`how: 'mac'`).
 * Interfaces left unmatched, and matched NICs without a MAC to match on, are `carried: false` with
 * the reason; the caller turns them into a notice.
 */
import type { CarriedInterface } from '../job.ts'
import type { ManifestNic } from '../manifest.ts'
import { normalizeMac } from '../mac.ts'
import type { ConfiguredInterface, NamingRule } from './net-config.ts'

/** What the inspection found about the guest's network (see `GuestInspection.network`). */
export interface GuestNetwork {
  interfaces: ConfiguredInterface[]
  rules: NamingRule[]
  /** Files read that could not be parsed or were too large, in words. */
  notes: string[]
}

/**
 * A file to write into the guest: path, content, mode (absent: the file's own mode, 0644 for a new
 * file); `expect`: the text the file must still hold (the write fails, and everything is put
 * back, when it holds anything else: the guest changed since it was read).
 */
export interface GuestFileWrite {
  path: string
  content: string
  mode?: number
  expect?: string
}

/** The network identity plan of one guest: what to write and what the job will report. */
export interface NetworkIdentityPlan {
  interfaces: CarriedInterface[]
  writes: GuestFileWrite[]
  /** Words for every configured interface that will not come up as on the source (empty: none). */
  problems: string[]
}

/** A NIC of the destination, in source order: label, MAC as the domain will have it, source PCI slot. */
export interface DestinationNic {
  label: string
  mac: string | null
  pciSlot: number | null
}

/** The destination NICs of a manifest's NICs (MACs normalized as the domain XML writes them; duplicates dropped as it does). */
export function destinationNics(nics: ManifestNic[]): DestinationNic[] {
  const seen = new Set<string>()
  return nics.map((n) => {
    let mac = normalizeMac(n.mac)
    if (mac && seen.has(mac)) mac = null
    if (mac) seen.add(mac)
    return { label: n.label, mac, pciSlot: n.pci_slot ?? null }
  })
}

/** The `.link` file that names the NIC with `mac` `name` (systemd.link(5); PCI devices only, so a bridge or VLAN sharing the MAC never matches). */
export function linkFileFor(name: string, mac: string): GuestFileWrite {
  return {
    path: `/etc/systemd/network/10-migrator-${name}.link`,
    content: [
      '# Written by the VM migrator: keeps the name this interface had on the source hypervisor',
      '# (docs/network-identity.md). Remove it to get the default name.',
      '[Match]',
      `MACAddress=${mac}`,
      'Path=pci-*',
      '',
      '[Link]',
      `Name=${name}`,
      '',
    ].join('\n'),
    mode: 0o644,
  }
}

/** A name a NIC may be given by a `.link` file: what the kernel accepts (`IFNAMSIZ`), no `/`, `:` or blanks. */
export function validInterfaceName(name: string): boolean {
  return /^[A-Za-z0-9_.-]{1,15}$/.test(name) && name !== '.' && name !== '..'
}

function describeFiles(list: ConfiguredInterface[]): string[] {
  const out: string[] = []
  for (const c of list) {
    const s = `${c.style}:${c.file}`
    if (!out.includes(s)) out.push(s)
  }
  return out
}

/**
 * The plan for `network` on `nics` (see the module comment). Interfaces are grouped by name (a
 * name configured in two files is one interface); nameless ones by MAC.
 */
export function planNetworkIdentity(network: GuestNetwork, nics: DestinationNic[]): NetworkIdentityPlan {
  const groups = new Map<string, ConfiguredInterface[]>()
  for (const c of network.interfaces) {
    const key = c.name !== null ? `name:${c.name}` : c.mac !== null ? `mac:${c.mac}` : null
    if (key === null) continue
    const list = groups.get(key) ?? []
    list.push(c)
    groups.set(key, list)
  }
  const physicalNames = [...groups.keys()].filter((k) => k.startsWith('name:'))
  const interfaces: CarriedInterface[] = []
  const writes: GuestFileWrite[] = []
  const problems: string[] = []
  const used = new Set<string>()
  for (const [key, list] of groups) {
    const name = key.startsWith('name:') ? key.slice(5) : null
    const configMac = list.map((c) => c.mac).find((m) => m !== null) ?? null
    const rec: CarriedInterface = {
      name,
      mac: null,
      nic: null,
      config: describeFiles(list),
      method: list.some((c) => c.method === 'static') ? 'static' : list.some((c) => c.method === 'dhcp') ? 'dhcp' : list[0]!.method,
      addresses: [...new Set(list.flatMap((c) => c.addresses))],
      gateway: list.map((c) => c.gateway).find((g) => g) ?? null,
      gateway6: list.map((c) => c.gateway6).find((g) => g) ?? null,
      routes: [...new Set(list.flatMap((c) => c.routes))],
      dns: [...new Set(list.flatMap((c) => c.dns))],
      carried: false,
      how: null,
      matched_by: null,
      link_file: null,
      why: null,
      address_check: 'not-checked',
      address_evidence: null,
    }
    interfaces.push(rec)
    const label = name ?? `the interface with MAC ${configMac}`
    const where = rec.config.join(', ')
    if (name === null) {
      const nic = nics.find((n) => n.mac === configMac)
      if (nic) Object.assign(rec, { carried: true, how: 'mac', matched_by: 'config-mac', mac: nic.mac, nic: nic.label })
      else rec.why = `no NIC of the destination has MAC ${configMac}`
    } else {
      const rule = network.rules.find((r) => r.name === name && nics.some((n) => n.mac === r.mac))
      let nic: DestinationNic | undefined
      let by: CarriedInterface['matched_by'] = null
      if (rule) {
        nic = nics.find((n) => n.mac === rule.mac)
        by = 'guest-rule'
      } else if (configMac) {
        nic = nics.find((n) => n.mac === configMac)
        by = 'config-mac'
      } else {
        const slot = /^ens(\d+)$/.exec(name)
        const eth = /^eth(\d+)$/.exec(name)
        if (slot) {
          nic = nics.find((n) => n.pciSlot === Number(slot[1]))
          by = 'slot'
        } else if (eth) {
          nic = nics[Number(eth[1])]
          by = 'eth-index'
        }
        if (!nic && nics.length === 1 && physicalNames.length === 1) {
          nic = nics[0]
          by = 'only-nic'
        }
      }
      if (!nic) {
        rec.why = configMac
          ? `no NIC of the destination has MAC ${configMac}`
          : `no NIC of the destination matches the name ${name} (${nics.length} NIC(s): ${nics.map((n) => `${n.label}${n.pciSlot !== null ? ` slot ${n.pciSlot}` : ''}`).join(', ') || 'none'})`
      } else if (!nic.mac) {
        rec.why = `NIC ${nic.label} has no MAC in the source (the destination generates one): nothing to match the name ${name} on`
        rec.nic = nic.label
      } else if (used.has(nic.mac)) {
        rec.why = `NIC ${nic.label} is already carried as another interface`
        rec.nic = nic.label
      } else if (!validInterfaceName(name)) {
        rec.why = `${JSON.stringify(name.slice(0, 40))} is not an interface name a .link file may give`
        rec.nic = nic.label
      } else {
        used.add(nic.mac)
        Object.assign(rec, { carried: true, mac: nic.mac, nic: nic.label, matched_by: by })
        if (rule) {
          rec.how = 'guest-rule'
        } else {
          const w = linkFileFor(name, nic.mac)
          writes.push(w)
          rec.how = 'link-file'
          rec.link_file = w.path
        }
      }
    }
    if (!rec.carried) problems.push(`configured interface ${label} (${where}) cannot be carried over: ${rec.why}`)
  }
  return { interfaces, writes, problems }
}
