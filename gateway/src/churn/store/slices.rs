//! How the store holds EndpointSlices: each service's slices and endpoint count, and the form
//! each slice is held in (see the module docs of [`super`] and [`HeldSlice`]).

use std::collections::HashMap;
use std::sync::Arc;

use super::{Store, Touched};
use crate::model::{
    Dictionary, Form, Group, HeldSlice, NsName, Object, SliceEndpoint, SliceObject,
    shared_dictionary,
};

impl Store {
    /// A slice applied or deleted: the endpoints it changed, its service's (and, when its
    /// service label changed, its former service's) endpoint count and slices, and the groups
    /// of those that are selected.
    pub(super) fn change_slice(&mut self, id: &NsName, obj: Option<Object>) -> Touched {
        let mut t = Touched::default();
        let old = self.slices.remove(id);
        self.deflated -= usize::from(old.as_ref().is_some_and(for_cap));
        let new = match obj {
            Some(Object::EndpointSlice(s)) => Some(s),
            _ => None,
        };
        t.endpoints_changed = endpoints_changed(old.as_ref(), new.as_ref());
        let old_svc = old.as_ref().and_then(HeldSlice::service);
        let new_svc = new.as_ref().and_then(HeldSlice::service);
        let capped_before = [&old_svc, &new_svc].map(|s| s.as_ref().map(|s| self.capped(s)));
        if let (Some(o), Some(svc)) = (&old, &old_svc) {
            self.release_slice(id, o, svc, new_svc.as_ref() != Some(svc));
        }
        if let (Some(n), Some(svc)) = (new, &new_svc) {
            let fresh = old.is_none();
            self.hold_slice(id, n, svc, (old_svc.as_ref() != Some(svc), fresh));
        }
        for (svc, before) in [&old_svc, &new_svc].into_iter().zip(capped_before) {
            if let Some(svc) = svc
                && before != Some(self.capped(svc))
            {
                self.reform(svc);
            }
        }
        for svc in [old_svc, new_svc].into_iter().flatten() {
            if self.is_selected(&svc) {
                t.relevant = true;
                if !t.groups.contains(&Group::Service(svc.clone())) {
                    t.groups.push(Group::Service(svc));
                }
            }
        }
        t
    }

    /// Holds slice `id` of `svc`, counting its endpoints; `moved` when `svc` did not hold it
    /// before (a new slice, or one whose service label changed), `fresh` when no state of it
    /// was held. The slice is held deflated against its service's dictionary when that leaves
    /// its service over the cap; against the shared one when it is fresh (a start's slices are
    /// not all held whole at once until their services publish); as it is given
    /// otherwise, until its service publishes ([`Self::freeze`]): a slice that changes again
    /// and again is deflated once a publication.
    fn hold_slice(
        &mut self,
        id: &NsName,
        mut slice: HeldSlice,
        svc: &NsName,
        (moved, fresh): (bool, bool),
    ) {
        *self.slice_endpoints.entry(svc.clone()).or_default() += slice.len();
        if moved {
            self.slices_by_service
                .entry(svc.clone())
                .or_default()
                .insert(id.clone());
        }
        if self.capped(svc) {
            let dictionary = (self.dictionaries.entry(svc.clone()))
                .or_insert_with(|| slice.json().as_bytes().into());
            slice.reform(Form::Deflated(Some(dictionary)));
        } else if fresh {
            slice.reform(Form::Deflated(Some(shared_dictionary())));
        }
        self.deflated += usize::from(for_cap(&slice));
        self.slices.insert(id.clone(), slice);
    }

    /// True when `svc` has more endpoints upstream than the cap publishes.
    fn capped(&self, svc: &NsName) -> bool {
        self.endpoint_count(svc) > self.max_endpoints
    }

    /// Holds every slice of `svc` as its count says (see [`Self::hold_slice`]): once, as it
    /// crosses the cap either way.
    fn reform(&mut self, svc: &NsName) {
        let capped = self.capped(svc);
        let dictionary = match capped {
            true => self.dictionary(svc),
            false => {
                self.dictionaries.remove(svc);
                None
            }
        };
        let form = Form::Deflated(Some(dictionary.as_ref().unwrap_or(shared_dictionary())));
        for id in self.slices_by_service.get(svc).into_iter().flatten() {
            if let Some(s) = self.slices.get_mut(id) {
                self.deflated -= usize::from(for_cap(s));
                s.reform(form);
                self.deflated += usize::from(for_cap(s));
            }
        }
    }

    /// Deflates the slices of `svc` held whole against the [`shared_dictionary`]: before its
    /// service publishes, so that what it publishes is what the store holds (a slice over
    /// the cap is deflated already).
    pub fn freeze(&mut self, svc: &NsName) {
        for id in self.slices_by_service.get(svc).into_iter().flatten() {
            if let Some(s @ HeldSlice::Whole(_)) = self.slices.get_mut(id) {
                s.reform(Form::Deflated(Some(shared_dictionary())));
            }
        }
    }

    /// What the slices of `svc`, over the cap, are deflated against: the dictionary it has,
    /// or else the JSON of its first slice.
    fn dictionary(&mut self, svc: &NsName) -> Option<Dictionary> {
        if let Some(d) = self.dictionaries.get(svc) {
            return Some(d.clone());
        }
        let first = (self.slices_by_service.get(svc)?.iter())
            .find_map(|id| Some(Dictionary::from(self.slices.get(id)?.json().as_bytes())))?;
        self.dictionaries.insert(svc.clone(), first.clone());
        Some(first)
    }

    /// Takes what slice `id` of `svc` was (`old`) off its service's endpoint count; `moved`
    /// when `svc` holds it no more (deleted, or its service label changed).
    fn release_slice(&mut self, id: &NsName, old: &HeldSlice, svc: &NsName, moved: bool) {
        if let Some(n) = self.slice_endpoints.get_mut(svc) {
            *n = n.saturating_sub(old.len());
            if *n == 0 {
                self.slice_endpoints.remove(svc);
            }
        }
        if moved && let Some(set) = self.slices_by_service.get_mut(svc) {
            set.remove(id);
            if set.is_empty() {
                self.slices_by_service.remove(svc);
            }
        }
    }
}

/// True when `s` is deflated against its service's dictionary, for the cap (see
/// [`Store::slices_deflated`]).
pub(super) fn for_cap(s: &HeldSlice) -> bool {
    s.dictionary()
        .is_some_and(|d| !Arc::ptr_eq(d, shared_dictionary()))
}

/// Endpoints that differ between two states of a slice: added, removed, or changed (matched
/// by their first address; a new address is a removal and an addition). A state held deflated
/// is thawed to compare.
pub(super) fn endpoints_changed(old: Option<&HeldSlice>, new: Option<&HeldSlice>) -> usize {
    let (old, new) = (old.map(HeldSlice::whole), new.map(HeldSlice::whole));
    let (old, new) = (old.as_deref(), new.as_deref());
    fn by_address(s: Option<&SliceObject>) -> HashMap<&str, SliceEndpoint<'_>> {
        s.into_iter()
            .flat_map(SliceObject::endpoints)
            .map(|e| (e.first_address(), e))
            .collect()
    }
    let (old, new) = (by_address(old), by_address(new));
    let changed = new
        .iter()
        .filter(|(a, e)| old.get(*a).is_none_or(|o| o != *e))
        .count();
    changed + old.keys().filter(|a| !new.contains_key(*a)).count()
}
