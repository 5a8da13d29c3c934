/**
 * Property collector and task helpers of the vSphere API (vSphere Web Services SDK Programming
 * Guide, "Property Collector" and "Tasks"): `RetrievePropertiesEx` with
 * `ContinueRetrievePropertiesEx` paging, container views, and waiting for a task's `info.state`.
 */
import { MigError } from '../../errors.ts'
import { sleep } from '../../retry.ts'
import { type VimClient, VimFault, arr, moref, txt, x, xsiType, type MoRef, type XNode } from './soap.ts'

/** One object of a property retrieval: its reference and `path -> value node`. */
export interface ObjectProps {
  obj: MoRef
  props: Record<string, XNode>
}

/** Upper bound of result pages followed (1 000 pages of `maxObjects`). */
const MAX_PAGES = 1000

function propSpec(type: string, paths: string[]): string {
  return x.node('propSet', [x.text('type', type), x.text('all', false), x.list('pathSet', paths)])
}

function collect(returnval: XNode, out: ObjectProps[]): string | null {
  for (const o of arr(returnval?.objects)) {
    const obj = moref(o.obj)
    if (!obj) continue
    const props: Record<string, XNode> = {}
    for (const p of arr(o.propSet)) {
      const name = txt(p.name)
      if (name) props[name] = p.val
    }
    out.push({ obj, props })
  }
  return txt(returnval?.token) ?? null
}

/**
 * Retrieves `paths` of objects of `type` selected by the object spec XML `objectSet`, following
 * `ContinueRetrievePropertiesEx` tokens (`maxObjects` per page, at most 1 000 pages).
 * Throws {@link VimFault} (e.g. `ManagedObjectNotFound`), `E_MIG_SOURCE_UNREACHABLE`.
 */
export async function retrieve(client: VimClient, type: string, paths: string[], objectSet: string, maxObjects = 100): Promise<ObjectProps[]> {
  const pc = client.serviceContent.propertyCollector
  const spec = x.node('specSet', [propSpec(type, paths), objectSet])
  const out: ObjectProps[] = []
  let token = collect(await client.call('RetrievePropertiesEx', x.ref('_this', pc) + spec + x.node('options', [x.text('maxObjects', maxObjects)])), out)
  for (let page = 0; token !== null; page++) {
    if (page >= MAX_PAGES) {
      await client.call('CancelRetrievePropertiesEx', x.ref('_this', pc) + x.text('token', token)).catch(() => {})
      throw new MigError('E_MIG_SOURCE_UNREACHABLE', `${client.sdkUrl}: more than ${MAX_PAGES} pages of ${type} objects; refused`)
    }
    token = collect(await client.call('ContinueRetrievePropertiesEx', x.ref('_this', pc) + x.text('token', token)), out)
  }
  return out
}

/** Properties `paths` of the one object `ref` (`{}` entries are omitted when unset). Throws {@link VimFault} `ManagedObjectNotFound`. */
export async function retrieveOne(client: VimClient, ref: MoRef, paths: string[]): Promise<Record<string, XNode>> {
  const res = await retrieve(client, ref.type, paths, x.node('objectSet', [x.ref('obj', ref), x.text('skip', false)]))
  return res[0]?.props ?? {}
}

/**
 * Every object of `type` under the root folder, through a recursive container view that is
 * destroyed afterwards.
 */
export async function retrieveAll(client: VimClient, type: string, paths: string[], maxObjects = 100): Promise<ObjectProps[]> {
  const sc = client.serviceContent
  const view = moref(
    await client.call(
      'CreateContainerView',
      x.ref('_this', sc.viewManager) + x.ref('container', sc.rootFolder) + x.text('type', type) + x.text('recursive', true),
    ),
  )
  if (!view) throw new MigError('E_MIG_SOURCE_UNREACHABLE', `${client.sdkUrl}: CreateContainerView answered no view`)
  try {
    const traversal = x.node(
      'selectSet',
      [x.text('name', 'traverseView'), x.text('type', 'ContainerView'), x.text('path', 'view'), x.text('skip', false)],
      'TraversalSpec',
    )
    return await retrieve(client, type, paths, x.node('objectSet', [x.ref('obj', view), x.text('skip', true), traversal]), maxObjects)
  } finally {
    await client.call('DestroyView', x.ref('_this', view)).catch(() => {})
  }
}

/** A finished task: its result node (e.g. the new snapshot's reference). */
export interface TaskOutcome {
  result: XNode
}

/** A task that ended in error: the vSphere fault type and message. */
export class TaskFailed extends Error {
  constructor(
    readonly faultType: string,
    message: string,
  ) {
    super(message)
    this.name = 'TaskFailed'
  }
}

/**
 * Waits for `task` to end by polling `info` (every 100 ms growing to 1 s), at most `timeoutMs`
 * (default 1 h). Returns the result, throws {@link TaskFailed} when the task ended in error,
 * `E_MIG_SOURCE_UNREACHABLE` when it does not end in time or vanishes.
 */
export async function waitTask(client: VimClient, task: MoRef, what: string, timeoutMs = 3_600_000): Promise<TaskOutcome> {
  const deadline = Date.now() + timeoutMs
  let delay = 100
  for (;;) {
    let info: XNode
    try {
      info = (await retrieveOne(client, task, ['info'])).info
    } catch (e) {
      if (e instanceof VimFault && e.faultType === 'ManagedObjectNotFound')
        throw new MigError('E_MIG_SOURCE_UNREACHABLE', `${what}: task ${task.value} vanished`)
      throw e
    }
    const state = txt(info?.state)
    if (state === 'success') return { result: info.result }
    if (state === 'error') {
      const err = info.error ?? {}
      const type = xsiType(err.fault) ?? 'SystemError'
      const msg = txt(err.localizedMessage) || type
      throw new TaskFailed(type, `${what}: ${type}: ${msg}`.slice(0, 500))
    }
    if (Date.now() >= deadline)
      throw new MigError('E_MIG_SOURCE_UNREACHABLE', `${what}: task ${task.value} did not end within ${Math.round(timeoutMs / 1000)} s`)
    await sleep(delay)
    delay = Math.min(1000, delay * 2)
  }
}
