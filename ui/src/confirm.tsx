/** A modal confirmation (`<dialog>`): the page asks before an action that cannot be undone. */
import type { ComponentChildren } from 'preact'
import { useEffect, useRef } from 'preact/hooks'

/**
 * Shows `children` in a modal while `open`; `onConfirm` on the `confirm` button (test id
 * `confirm-<testid>`), `onClose` on the other button or Escape. The dialog stays open when the
 * job changes under it: the action then answers with its own error (409) instead of vanishing.
 */
export function ConfirmDialog(props: {
  open: boolean
  testid: string
  confirm: string
  keep: string
  danger?: boolean
  onConfirm(): void
  onClose(): void
  children: ComponentChildren
}) {
  const ref = useRef<HTMLDialogElement>(null)
  useEffect(() => {
    const d = ref.current
    if (!d) return
    if (props.open && !d.open) d.showModal()
    if (!props.open && d.open) d.close()
  }, [props.open])
  return (
    <dialog ref={ref} onClose={props.onClose} data-testid={`${props.testid}-dialog`}>
      {props.children}
      <div class="actions">
        <button onClick={props.onClose}>{props.keep}</button>
        <button class={props.danger ? 'danger' : 'primary'} onClick={props.onConfirm} data-testid={`confirm-${props.testid}`}>
          {props.confirm}
        </button>
      </div>
    </dialog>
  )
}
