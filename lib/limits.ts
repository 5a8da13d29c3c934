/**
 * What the destination can attach to one domain, in one place: the domain XML
 * builder (`lib/domain/xml.ts`) enforces it at define time, and inspect refuses a source beyond
 * it before any copy (importers and `inspectInput`).
 */
import { MigError } from './errors.ts'

/** Most disks and NICs a domain built here may have. */
export const DESTINATION_LIMITS = { maxDisks: 64, maxNics: 32 } as const

/**
 * Refuses a source of `disks` disks and `nics` NICs the destination cannot attach:
 * `E_MIG_MALFORMED_ARCHIVE` (422) naming `label` (the descriptor), the count and the limit.
 */
export function checkDestinationLimits(label: string, counts: { disks?: number; nics?: number }): void {
  const { maxDisks, maxNics } = DESTINATION_LIMITS
  if (counts.disks !== undefined && counts.disks > maxDisks) {
    throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: ${counts.disks} disks, more than the ${maxDisks} a destination domain can attach`, {
      details: { disks: counts.disks, max_disks: maxDisks },
    })
  }
  if (counts.nics !== undefined && counts.nics > maxNics) {
    throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: ${counts.nics} network adapters, more than the ${maxNics} a destination domain can attach`, {
      details: { nics: counts.nics, max_nics: maxNics },
    })
  }
}
