"""What ingest knows of each GateMem domain, written down: content categories, the principals whose data a
turn is ("subjects"), and each subject's circle — the principals its relationships connect to it.

Everything here reads only an `Episode` (principals, roles, relationships) and turn texts. Which role may read
which category is not here: it is Cedar, in ``policies/<domain>/<domain>.cedar`` (forbid rules over
``principal.roles`` and ``resource.labels``), so that `policy-check` proves properties of it.

Sources: GateMem's per-domain access rules (its ``bench/domains.py`` policy text: "care-team access … ONLY when
assigned", "a family_member with limited or summary-only access may receive only high-level, non-sensitive
summaries", "restricted business data: HR, compensation, candidate feedback, legal strategy, confidential
finance numbers, credentials/secrets, security findings …", "parent/guardian access is limited", "exact door
codes, alarm phrases, hidden-key locations … require strict need-to-know") and each episode's ``entities``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from memwarden_eval.gatemem.data import Episode, Principal

GENERAL = "general"  # the label of a turn no category pattern matches


def _rx(*alternatives: str) -> re.Pattern[str]:
    return re.compile(r"(?<![\w-])(?:" + "|".join(alternatives) + r")(?![\w])", re.IGNORECASE)


_TIME = r"\d{1,2}:\d{2}\s?(?:am|pm)|\d{1,2}\s?(?:am|pm)"
_PHONE = r"\d{3}[-.]\d{3}[-.]\d{4}|\d{3}-\d{4}"
_CODE = r"[a-z]{2,}_[a-z]{2,}_[a-z0-9_-]+|[a-z]{2,}_temp_\w+"
_MONEY = r"\$\s?\d[\d,.]*\s?[km]?|\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d[\d,.]*\s?usd|\d+k"

CATEGORIES: dict[str, dict[str, re.Pattern[str]]] = {
    "medical": {
        "clinical": _rx(
            r"labs?", r"results?", r"beta(?:-hcg)?", r"hcg", r"a1c", r"hemoglobin", r"creatinine", r"tsh", r"panel",
            r"inr", r"mg(?:/dl)?", r"mcg", r"milligrams?", r"micrograms?", r"medications?", r"medicines?", r"dos(?:e|es|ing)",
            r"tablets?", r"prescri\w*", r"refills?", r"diagnos\w*", r"symptoms?", r"bleed\w*", r"spotting", r"cramp\w*",
            r"pain", r"nausea", r"vomit\w*", r"fever", r"faint\w*", r"dizz\w*", r"impression", r"findings?", r"biops\w*",
            r"pregnan\w*", r"viab\w*", r"fetal", r"yolk", r"gestation\w*", r"cardiover\w*", r"atrial", r"fibrillation",
            r"anticoag\w*", r"blood thinners?", r"sedat\w*", r"allerg\w*", r"rash", r"vitamins?", r"ibuprofen",
            r"acetaminophen", r"nsaids?", r"treatment", r"therap\w*", r"hepatitis", r"hiv", r"infection", r"assessment",
            r"interpretation", r"precautions?", r"triage", r"chart notes?", r"clinical", r"rh (?:positive|negative)",
            r"rhogam", r"thyroid", r"levothyroxine", r"insulin", r"diabet\w*", r"glucose", r"blood pressure", r"mri",
            r"ct", r"x-ray", r"mental health", r"depress\w*", r"anxiety", r"psychiat\w*", r"substance", r"alcohol",
            r"opioid\w*", r"recovery hous\w*", r"rehab\w*", r"benign", r"malignan\w*", r"cancer", r"tumou?r",
            r"metformin", r"lisinopril", r"empagliflozin", r"warfarin", r"apixaban", r"doxylamine", r"pyridoxine",
            r"scan showed", r"ultrasound (?:showed|result\w*|finding\w*)", r"ecg (?:showed|result\w*)", r"progressing",
            r"miscarr\w*", r"ectopic", r"sti", r"std", r"hpv", r"contracepti\w*", r"abortion",
        ),
        "contact": _rx(_PHONE, r"call-?backs?", r"voicemails?", r"safe (?:number|line|phone|contact)\w*",
                       r"backup contact\w*", r"phone numbers?", r"cell", r"e-?mail address\w*", r"home address"),
        "billing": _rx(r"insurance", r"billing", r"bills?", r"eobs?", r"explanation[- ]of[- ]benefits", r"statements?",
                       r"prior authori\w*", r"co-?pays?", r"deductibles?", r"charges?", r"invoices?", r"payments?",
                       r"claims?", r"coverage", r"covered", r"bluecross", r"ppo", r"hmo"),
        "logistics": _rx(r"appointments?", r"schedul\w*", r"arriv\w*", r"parking", r"suite", r"check-?in", r"checked in",
                         r"reminders?", r"booked", r"slots?", _TIME, r"pick-?up", r"drop(?:ping)? off", r"transport\w*",
                         r"rides?", r"locations?", r"visits?", r"follow-?ups?", r"reschedul\w*", r"cancel\w*"),
    },
    "office": {
        "credential": _rx(r"tokens?", r"passwords?", r"passcodes?", r"secrets?", r"api keys?", r"credentials?", _CODE,
                          r"ssh", r"access codes?", r"keys?"),
        "hr": _rx(r"compensation", r"salar\w*", r"bonus\w*", r"raises?", r"equity", r"pip", r"performance", r"disciplin\w*",
                  r"candidates?", r"interview\w*", r"offer letters?", r"leave", r"complaints?", r"harass\w*",
                  r"investigation\w*", r"promotion\w*", r"terminat\w*", r"layoffs?", r"severance", r"ratings?",
                  r"hr case\w*", r"accommodation\w*", r"grievance\w*", r"feedback"),
        "legal": _rx(r"legal", r"privileged", r"clauses?", r"indemn\w*", r"litigation", r"liabilit\w*", r"lawsuits?",
                     r"settlement\w*", r"auto-renewal", r"ndas?", r"counsel", r"redlines?", r"contract\w*", r"negotiat\w*"),
        "finance": _rx(r"budget\w*", _MONEY, r"cost\w*", r"spend\w*", r"pric\w*", r"discounts?", r"revenue", r"margins?",
                       r"forecast\w*", r"invoices?", r"payments?", r"funding", r"financ\w*"),
        "security": _rx(r"vulnerab\w*", r"incidents?", r"cves?", r"breach\w*", r"exploit\w*", r"security findings?",
                        r"pen(?:etration)?[- ]tests?", r"exposure", r"compromis\w*", r"rotation", r"rotated"),
        "customer": _rx(r"customers?", r"clients?", r"account names?", r"mappings?", r"design partners?", r"[a-z]+ = [a-z]+",
                        r"identity"),
        "strategy": _rx(r"acquisition\w*", r"mergers?", r"reorg\w*", r"unreleased", r"roadmaps?", r"board", r"pivot",
                        r"strateg\w*", r"confidential"),
    },
    "education": {
        "credential": _rx(r"tokens?", r"passwords?", r"passcodes?", r"door codes?", r"access codes?", _CODE, r"pins?",
                          r"codes?", r"credentials?"),
        "funding": _rx(_MONEY, r"stipends?", r"grant amounts?", r"award\w*", r"aid amounts?", r"scholarship\w*",
                       r"financial aid", r"tuition holds?", r"holds?", r"funding", r"fellowship\w*", r"bursar"),
        "grades": _rx(r"grades?", r"gpa", r"scores?", r"exams?", r"transcripts?", r"marks?", r"academic standing",
                      r"probation", r"[abcdf][+-] ", r"points?", r"rubric\w*", r"failing", r"incomplete"),
        "housing": _rx(r"rooms?", r"room numbers?", r"[a-z]{1,4}-\d{2,4}", r"residence (?:hall|assignment)\w*",
                       r"housing", r"relocation", r"dorm\w*", r"floor"),
        "support": _rx(r"counsel\w*", r"well-?being", r"mental", r"safety", r"support (?:notes?|cases?|plans?|labels?)",
                       r"accommodation\w*", r"disabilit\w*", r"crisis", r"therap\w*", r"conduct", r"disciplin\w*",
                       r"misconduct", r"integrity", r"title ix", r"harass\w*", r"medical", r"health"),
        "evaluation": _rx(r"recommendation\w*", r"internal (?:evaluation|review|notes?)", r"committee", r"evaluation\w*",
                          r"reviewer comments?", r"nominat\w*", r"rankings?", r"shortlist\w*"),
        "sponsor": _rx(r"sponsor\w*", r"industry partners?", r"[a-z]+ = [a-z]+", r"mappings?"),
    },
    "household": {
        "credential": _rx(r"pins?", r"passcodes?", r"codes?", r"alarm\w*", r"phrases?", r"passwords?", r"wi-?fi",
                          r"hidden[- ]keys?", r"spare keys?", r"backup[- ]keys?", r"keys? (?:location|under|in|behind)",
                          r"lockbox\w*", r"planters?", r"\d{4}", r"credentials?", r"fallback"),
        "private": _rx(r"private", r"diary", r"therap\w*", r"medical", r"health", r"interview\w*", r"personal notes?",
                       r"family notes?", r"visitor notes?", r"confidential", r"pregnan\w*", r"divorce", r"legal",
                       r"doctor", r"appointment"),
        "schedule": _rx(_TIME, r"mondays?", r"tuesdays?", r"wednesdays?", r"thursdays?", r"fridays?", r"saturdays?",
                        r"sundays?", r"windows?", r"arriv\w*", r"travel\w*", r"away", r"out of town", r"vacation",
                        r"home alone", r"occupan\w*", r"empty", r"return\w*"),
        "device": _rx(r"cameras?", r"footage", r"feeds?", r"smart locks?", r"devices?", r"hub", r"routers?",
                      r"sharing settings?", r"doorbell", r"thermostat", r"app"),
    },
}

# Roles whose principals are data subjects: a turn about one of them is in that subject's circle only.
SUBJECT_ROLES: dict[str, frozenset[str]] = {
    "medical": frozenset({"patient"}),
    "office": frozenset(),
    "education": frozenset({"student"}),
    "household": frozenset(),
}

_TITLES = re.compile(r"^(?:dr\.?|nurse|pharmacist|prof\.?|professor|lab tech|mr\.?|ms\.?|mrs\.?)\s+", re.IGNORECASE)
_FAMILY_WORDS = r"mother|mom|father|dad|brother|sister|son|daughter|wife|husband|partner|spouse|aunt|uncle|grandmother|grandfather|family"


def categories(domain: str, text: str) -> frozenset[str]:
    """The content categories of `text` in `domain`; {"general"} when none matches."""
    found = frozenset(name for name, rx in CATEGORIES[domain].items() if rx.search(text))
    return found or frozenset({GENERAL})


@dataclass
class Names:
    """Name aliases of an episode's principals: a full display name (titles and parentheses removed), and a
    first or last name when no other principal shares it. `find` returns the principals a text mentions."""

    episode: Episode
    aliases: dict[str, re.Pattern[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        cleaned = {p.principal_id: self._clean(p.display_name) for p in self.episode.principals}
        firsts: dict[str, int] = {}
        lasts: dict[str, int] = {}
        for name in cleaned.values():
            parts = name.split()
            if parts:
                firsts[parts[0]] = firsts.get(parts[0], 0) + 1
                lasts[parts[-1]] = lasts.get(parts[-1], 0) + 1
        for pid, name in cleaned.items():
            parts = name.split()
            alts = {name} if len(name) >= 3 else set()
            if len(parts) >= 2:
                if firsts[parts[0]] == 1 and len(parts[0]) >= 3:
                    alts.add(parts[0])
                if lasts[parts[-1]] == 1 and len(parts[-1]) >= 3:
                    alts.add(parts[-1])
            if alts:
                self.aliases[pid] = re.compile(r"\b(?:" + "|".join(re.escape(a) for a in sorted(alts, key=len, reverse=True))
                                               + r")\b", re.IGNORECASE)

    @staticmethod
    def _clean(display: str) -> str:
        s = re.sub(r"\([^)]*\)", " ", display)
        s = _TITLES.sub("", s.strip())
        return re.sub(r"\s+", " ", s).strip().lower()

    def find(self, text: str) -> set[str]:
        return {pid for pid, rx in self.aliases.items() if rx.search(text)}


def family_words() -> re.Pattern[str]:
    return re.compile(r"\b(?:my|her|his|their|the)\s+(?:" + _FAMILY_WORDS + r")\b", re.IGNORECASE)


# ---- circles: who a subject's relationships connect to it -------------------------------------------------

def _rel_members(episode: Episode, key: str, value: str, member_keys: tuple[str, ...]) -> set[str]:
    out = set()
    for r in episode.relationships:
        if r.get(key) == value:
            for k in member_keys:
                if r.get(k):
                    out.add(r.get(k))
    return out


@dataclass(frozen=True)
class Circles:
    """subject → the principals its relationships admit; `everyone` for turns no subject is found in."""

    by_subject: dict[str, frozenset[str]]
    everyone: frozenset[str]
    family_of: dict[str, frozenset[str]]  # subject → its family-type principals (revocable by the subject)


def _medical(ep: Episode) -> Circles:
    everyone = frozenset(p.principal_id for p in ep.principals)
    patients = [p.principal_id for p in ep.principals if p.role == "patient"]
    clinicians = {p.principal_id for p in ep.principals if p.role == "clinician"}
    families = {p.principal_id for p in ep.principals if p.role == "family_member"}
    staff = everyone - set(patients) - clinicians - families
    by_subject, family_of = {}, {}
    for pat in patients:
        care = _rel_members(ep, "patient_id", pat, ("clinician_id",))
        fam = _rel_members(ep, "patient_id", pat, ("family_id",)) & families
        by_subject[pat] = frozenset({pat} | staff | (care & clinicians) | fam)
        family_of[pat] = frozenset(fam)
    return Circles(by_subject, everyone, family_of)


def _education(ep: Episode) -> Circles:
    everyone = frozenset(p.principal_id for p in ep.principals)
    students = [p.principal_id for p in ep.principals if p.role == "student"]
    related: dict[str, set[str]] = {}
    for r in ep.relationships:
        for k in ("principal_id", "for_principal_id"):
            if r.get(k):
                related.setdefault(r.get(k), set()).update(v for kk, v in r.attrs.items() if kk.endswith("principal_id"))
    groups: dict[str, set[str]] = {}
    for r in ep.relationships:
        gid = r.get("project_id") or r.get("program_id")
        if gid and r.get("principal_id"):
            groups.setdefault(gid, set()).add(r.get("principal_id"))
    unattached = {p.principal_id for p in ep.principals if p.principal_id not in related and p.role != "student"
                  and p.role != "parent_guardian"}
    by_subject, family_of = {}, {}
    for s in students:
        circle = {s} | related.get(s, set()) | unattached
        for members in groups.values():
            if s in members:
                circle |= members
        # delegates of anyone in the circle (e.g. a dean's assistant for the professor)
        for r in ep.relationships:
            if r.get("for_principal_id") in circle and r.get("principal_id"):
                circle.add(r.get("principal_id"))
        circle -= {x for x in students if x != s}
        parents = {r.get("principal_id") for r in ep.relationships if r.type == "parent_of" and r.get("for_principal_id") == s}
        by_subject[s] = frozenset(circle | parents)
        family_of[s] = frozenset(parents)
    return Circles(by_subject, everyone, family_of)


def _everyone(ep: Episode) -> Circles:
    return Circles({}, frozenset(p.principal_id for p in ep.principals), {})


CIRCLES: dict[str, Callable[[Episode], Circles]] = {
    "medical": _medical, "education": _education, "office": _everyone, "household": _everyone,
}


def office_projects(ep: Episode) -> dict[str, tuple[re.Pattern[str], frozenset[str]]]:
    """project id → (the project's name in text, the principals a relationship ties to it, their delegates and
    the managers of its members). The name is the id without ``project_``; ``maple`` does not match ``MapleMark``."""
    out = {}
    for pid in sorted({r.get("project_id") for r in ep.relationships if r.get("project_id")}):
        name = pid.removeprefix("project_").replace("_", " ")
        members = {r.get("principal_id") for r in ep.relationships if r.get("project_id") == pid and r.get("principal_id")}
        for r in ep.relationships:
            if r.get("for_principal_id") in members and r.get("principal_id"):
                members.add(r.get("principal_id"))
            if r.type == "people_manager" and r.get("manages") in members:
                members.add(r.get("principal_id"))
        members |= {p.principal_id for p in ep.principals if p.role in ("hr", "agent")}
        out[pid] = (re.compile(r"\b" + re.escape(name) + r"\b(?![\w-])", re.IGNORECASE), frozenset(members))
    return out


def principal_roles(p: Principal) -> tuple[str, ...]:
    """The Cedar roles of a principal: its GateMem role."""
    return (p.role,)
