/**
 * Plan submission (spec 4 `POST /migrations`): validation of the plan and of what it refers to,
 * then a persisted `Queued` job. Running it is the job engine's work.
 */
import { randomUUID } from 'node:crypto'
import { existsSync } from 'node:fs'
import * as path from 'node:path'
import { MigError } from '../errors.ts'
import { credentialProblem } from '../remote/open.ts'
import { resolveInRoot } from '../hostpath.ts'
import type { Job } from '../job.ts'
import { parseSubmitBody, strategyOf, type Plan } from '../plan.ts'
import type { Store } from '../store/index.ts'
import { initialCutover, type JobPlacement } from '../store/jobs.ts'

/**
 * Checks that the plan's `source_ref` points at something that exists:
 * - `live_vm`: a registered source (`E_MIG_NOT_FOUND`) of the plan's adapter kind (`E_MIG_INVALID_PLAN`);
 * - `offline_host_path`: a path inside the import root (`E_MIG_HOST_PATH_REJECTED`) that exists (`E_MIG_NOT_FOUND`);
 * - `upload`: a ready, unexpired upload (`E_MIG_UPLOAD_NOT_FOUND`);
 * - `offline_url`: its `credential_id`, when given, is registered (`E_MIG_NOT_FOUND`).
 */
export async function checkPlanRefs(plan: Plan, store: Store, importRoot: string, now: Date): Promise<void> {
  const ref = plan.source_ref
  if (ref.kind === 'live_vm') {
    const source = await store.sources.get(ref.source_id)
    const kind = 'Live' in plan.source ? plan.source.Live : null
    if (source.kind !== kind) {
      throw new MigError('E_MIG_INVALID_PLAN', `plan.source is Live ${kind} but source ${source.id} is ${source.kind}`, {
        details: { issues: [{ path: 'plan.source.Live', message: `source ${source.id} is of kind ${source.kind}` }] },
      })
    }
  } else if (ref.kind === 'offline_host_path') {
    const abs = resolveInRoot(importRoot, ref.path)
    if (path.relative(resolveInRoot(importRoot, '.'), abs) === '') {
      throw new MigError('E_MIG_HOST_PATH_REJECTED', 'plan.source_ref.path is the import root itself; name the export file or folder inside it', {
        details: { path: ref.path },
      })
    }
    if (!existsSync(abs)) throw new MigError('E_MIG_NOT_FOUND', `plan.source_ref.path ${JSON.stringify(ref.path)} does not exist in the import root`)
  } else if (ref.kind === 'offline_url') {
    // the object itself is opened by the job (or POST /remote-files/inspect); its credential must exist now
    if (ref.credential_id) {
      const c = await store.remoteCredentials.get(ref.credential_id).catch((e: unknown) => {
        throw new MigError('E_MIG_NOT_FOUND', `plan.source_ref.credential_id: ${(e as Error).message}`, { details: { path: 'plan.source_ref.credential_id' } })
      })
      const problem = credentialProblem(new URL(ref.url).protocol, c.kind)
      if (problem)
        throw new MigError('E_MIG_INVALID_PLAN', `plan.source_ref.credential_id: ${problem}`, {
          details: { issues: [{ path: 'plan.source_ref.credential_id', message: problem }] },
        })
    }
  } else {
    await store.uploads.get(ref.upload_id, now.toISOString())
  }
}

/**
 * Checks that every bridge of `plan.networks` exists on this host (`<netDir>/<bridge>`, default
 * `/sys/class/net`): a plan naming a missing bridge is refused at submission,
 * `E_MIG_INVALID_PLAN` with one issue per bridge (the job checks again before its copy).
 */
export function checkPlanBridges(plan: Plan, netDir = '/sys/class/net'): void {
  const issues = (plan.networks ?? []).flatMap((m, i) =>
    existsSync(path.join(netDir, m.bridge))
      ? []
      : [
          {
            path: `plan.networks.${i}.bridge`,
            message: `no bridge ${m.bridge} on this host: create it (ip link add ${m.bridge} type bridge) or map ${JSON.stringify(m.source)} to an existing bridge`,
          },
        ],
  )
  if (issues.length) throw new MigError('E_MIG_INVALID_PLAN', issues.map((x) => `${x.path}: ${x.message}`).join('; '), { details: { issues } })
}

/**
 * Validates a `POST /migrations` body and persists the job (state `Queued`). Offline jobs run
 * cold whatever `mode` says (`effective_mode: "Cold"`); live jobs start with the plan's mode and
 * may be downgraded later (spec 1.4). Throws `E_MIG_INVALID_PLAN` (also for a missing bridge,
 * {@link checkPlanBridges}) plus the codes of {@link checkPlanRefs}, and `E_MIG_PERSIST_FAILED`.
 */
export async function submitPlan(body: unknown, store: Store, importRoot: string, now: Date, opts: SubmitOptions = {}): Promise<Job> {
  const plan = parseSubmitBody(body)
  await checkPlanRefs(plan, store, importRoot, now)
  checkPlanBridges(plan)
  return createJob(plan, store, now, opts)
}

/** Submission settings: the configured `precopy_interval_seconds` default (300 s when absent). */
export interface SubmitOptions {
  precopyIntervalSeconds?: number
}

/** Persists a `Queued` job for a checked plan (`placement`: its bulk plan and dependencies). */
export function createJob(plan: Plan, store: Store, now: Date, opts: SubmitOptions = {}, placement?: JobPlacement): Promise<Job> {
  const strategy = strategyOf(plan)
  const cutover = initialCutover(plan, strategy, opts.precopyIntervalSeconds ?? 300)
  return store.jobs.create({
    id: randomUUID(),
    plan,
    strategy,
    effective_mode: strategy === 'live' ? plan.mode : 'Cold',
    now: now.toISOString(),
    cutover,
    placement,
  })
}
