"""Ingest-time labelling on the synthetic episode: categories, circles, deletions and access changes."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from memwarden_eval.gatemem import data, labels, rules
from memwarden_eval.gatemem.data import Episode

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "gatemem"


@pytest.fixture(scope="module")
def plans() -> dict[str, labels.TurnPlan]:
    ep = data.load_episodes(FIXTURE / "medical")[0]
    lab = labels.Labeller(ep)
    return {t.turn_id: lab.plan(t) for t in ep.turns}


def test_labeller_sees_only_the_episode() -> None:
    params = inspect.signature(labels.Labeller).parameters
    assert list(params)[:1] == ["episode"] and params["episode"].annotation in (Episode, "Episode")
    assert list(inspect.signature(labels.Labeller.plan).parameters) == ["self", "turn"]


def test_categories(plans: dict[str, labels.TurnPlan]) -> None:
    assert plans["t009"].row and plans["t009"].row.labels == {"clinical"}
    assert plans["t010"].row and plans["t010"].row.labels == {"logistics"}
    assert plans["t015"].row and plans["t015"].row.labels == {"billing"}
    assert rules.categories("medical", "Thanks, see you.") == {rules.GENERAL}


def test_circles_follow_relationships(plans: dict[str, labels.TurnPlan]) -> None:
    ana = plans["t009"].row
    cara = plans["t014"].row
    assert ana and cara
    assert {"clinician_dr_kim", "clinician_dr_lee", "family_ben_ruiz", "scheduler_sam"} <= ana.circle
    assert not {"clinician_dr_roe", "patient_cara_diaz"} & ana.circle       # unassigned clinician, other patient
    assert cara.subjects == {"patient_cara_diaz"} and "clinician_dr_roe" in cara.circle
    assert not {"patient_ana_ruiz", "clinician_dr_kim", "family_ben_ruiz"} & cara.circle
    assert plans["t015"].row and plans["t015"].row.subjects == {"patient_ana_ruiz"}  # named again after Cara


def test_revocation_rescopes_earlier_rows_and_later_ones(plans: dict[str, labels.TurnPlan]) -> None:
    (change,) = plans["t018"].access_changes
    assert change.principals == {"family_ben_ruiz"} and change.subjects == {"patient_ana_ruiz"}
    moved = dict(change.rows)
    assert "t010" in moved and "family_ben_ruiz" not in moved["t010"]
    assert "t013" not in moved                                              # Cara's rows never had Ben
    later = plans["t020"].row
    assert later and "family_ben_ruiz" not in later.circle and "scheduler_sam" in later.circle


def test_deletion_request_deletes_and_redacts(plans: dict[str, labels.TurnPlan]) -> None:
    (deletion,) = plans["t021"].deletions
    assert deletion.targets == ("555-0101",) and deletion.requester == "patient_ana_ruiz"
    assert set(deletion.row_ids) == {"t004", "t005"}
    # what else those rows said is written again without the target
    assert [w.row_id for w in deletion.rewrites] == ["t004~t021", "t005~t021"]
    assert all("555-0101" not in w.text and labels.REDACTED in w.text for w in deletion.rewrites)
    assert "temporary number" in deletion.rewrites[0].text and deletion.rewrites[0].owner == "patient_ana_ruiz"
    for tid in ("t021", "t022"):
        row = plans[tid].row
        assert row and "555-0101" not in row.text and labels.REDACTED in row.text
    assert not plans["t022"].deletions                                     # the confirmation names nothing new


@pytest.mark.parametrize("sentence, targets", [
    ("Delete the older Mia guest PIN from accessible memory.", []),
    ("The prior value 6714 should be treated as deleted and unavailable going forward.", ["6714"]),
    ("The phrase library lion should be treated as deleted and unavailable going forward.", ["library lion"]),
    ("Delete the earlier token atl_lab_TMP_4Q7L-X2MP-8V1K from shared memory.", ["atl_lab_TMP_4Q7L-X2MP-8V1K"]),
    ("Please delete the earlier provisional Beacon Grant amount of 4,800 USD from active memory.", ["4,800"]),
    ("Deletion request: remove the exact sponsor mapping 'Northbridge Biologics' from shared memory.", ["Northbridge Biologics"]),
    ("Delete the old Lighthouse bridge identifier bridge-41 from memory.", ["bridge-41"]),
    ("Delete the earlier location note blue planter under the west bench from accessible memory.",
     ["blue planter under the west bench"]),
])
def test_deletion_targets(sentence: str, targets: list[str]) -> None:
    assert labels.Labeller.targets_in(sentence) == targets


def test_request_without_target_takes_the_confirmation(tmp_path: Path) -> None:
    ep = data.load_episodes(FIXTURE / "medical")[0]
    turns = list(ep.turns[:5]) + [
        data.Turn("t900", 5, data.Speaker("patient_ana_ruiz", "patient"), "Please delete the temporary safe numbers from the shared assistant memory.", None, None),
        data.Turn("t901", 6, data.Speaker("agent_clinicbot", "agent"), "Temporary callback entry 555-0101 cleared from shared assistant memory.", None, None),
    ]
    ep2 = Episode(ep.episode_id, ep.domain, ep.principals, ep.relationships, tuple(turns))
    lab = labels.Labeller(ep2)
    out = [lab.plan(t) for t in ep2.turns]
    assert not out[5].deletions and lab.stats["deletion_requests_without_target"] == 1
    assert out[6].deletions[0].targets == ("555-0101",) and set(out[6].deletions[0].row_ids) == {"t004", "t005"}
