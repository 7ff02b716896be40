//! Clients, pairing codes and the pairing limit (docs/api.md, I-7), and the service's identity
//! (`initialize`, `check_writable`).

use lmsp_domain::auth::{Scope, SecretHash, PAIRING_TTL_MILLIS};
use lmsp_domain::ports::Redemption;

use crate::fixtures::*;
use crate::support::*;
use crate::{fresh_store, StoreFactory};

/// I-7: a client is found by its token's hash while it is not revoked and by its id always;
/// clients list oldest first, revoked ones included; revoking twice (or an unknown client)
/// revokes nothing.
pub async fn clients_are_found_by_token_hash_until_revoked_and_listed_oldest_first_i7<
    F: StoreFactory,
>(
    factory: &F,
) {
    let (store, listener) = fresh_store(factory).await;
    let (mut older, older_token) = client(&[Scope::ResponsesRead, Scope::ResponsesWrite]);
    older.created_at = time(1);
    let (mut newer, newer_token) = client(&[Scope::Admin]);
    newer.created_at = time(2);
    store.insert_client(newer.clone()).await.unwrap();
    store.insert_client(older.clone()).await.unwrap();
    assert_eq!(
        store
            .client_by_token_hash(older_token.hash())
            .await
            .unwrap(),
        Some(older.clone())
    );
    assert_eq!(store.client(newer.id).await.unwrap(), Some(newer.clone()));
    assert_eq!(
        store.list_clients().await.unwrap(),
        vec![older.clone(), newer.clone()]
    );
    assert_eq!(
        store
            .client_by_token_hash(SecretHash([0; 32]))
            .await
            .unwrap(),
        None
    );
    assert_eq!(store.client(client_id()).await.unwrap(), None);

    assert!(store.revoke_client(older.id, time(10)).await.unwrap());
    assert!(
        !store.revoke_client(older.id, time(11)).await.unwrap(),
        "already revoked"
    );
    assert!(
        !store.revoke_client(client_id(), time(11)).await.unwrap(),
        "unknown"
    );
    assert_eq!(
        store
            .client_by_token_hash(older_token.hash())
            .await
            .unwrap(),
        None,
        "I-7: a revoked token stops working at once"
    );
    let revoked = lmsp_domain::auth::Client {
        revoked_at: Some(time(10)),
        ..older
    };
    assert_eq!(
        store.client(revoked.id).await.unwrap(),
        Some(revoked.clone())
    );
    assert_eq!(
        store.list_clients().await.unwrap(),
        vec![revoked, newer.clone()]
    );
    assert_eq!(
        store
            .client_by_token_hash(newer_token.hash())
            .await
            .unwrap(),
        Some(newer)
    );
    assert!(listener.events().is_empty(), "clients write no task event");
}

/// I-7: token and model lookups made at once (as a burst of submits makes them; a store may
/// read them together) each answer their own: the client of its token, none for a revoked or
/// unknown token; the model of its id, none for an unknown id.
pub async fn lookups_made_at_once_each_answer_their_own_i7<F: StoreFactory>(factory: &F) {
    let (store, _listener) = fresh_store(factory).await;
    let mut clients = Vec::new();
    for i in 0..4 {
        let (mut one, token) = client(&[Scope::ResponsesWrite]);
        one.created_at = time(i);
        store.insert_client(one.clone()).await.unwrap();
        clients.push((one, token));
    }
    let revoked = clients.pop().unwrap();
    assert!(store.revoke_client(revoked.0.id, time(10)).await.unwrap());
    let models: Vec<_> = (0..3)
        .map(|i| file_model(&format!("model-{i}"), &format!("model-{i}.gguf")))
        .collect();
    for one in &models {
        assert!(store.insert_model(one.clone()).await.unwrap());
    }

    // Every token and id several times, in an order that is not the insertion order.
    let mut tokens = Vec::new();
    let mut ids = Vec::new();
    for round in 0..8 {
        for (one, token) in clients.iter().rev() {
            tokens.push((token.hash(), Some(one.clone())));
        }
        tokens.push((revoked.1.hash(), None));
        tokens.push((SecretHash([round; 32]), None));
        for one in models.iter().rev() {
            ids.push((one.id.clone(), Some(one.clone())));
        }
        ids.push((model(&format!("missing-{round}")), None));
    }
    let token_answers = futures::future::join_all(
        tokens
            .iter()
            .map(|(hash, _)| store.client_by_token_hash(*hash)),
    );
    let model_answers = futures::future::join_all(ids.iter().map(|(id, _)| store.model(id)));
    let (token_answers, model_answers) = tokio::join!(token_answers, model_answers);
    for ((hash, expected), answer) in tokens.iter().zip(token_answers) {
        assert_eq!(
            &answer.unwrap(),
            expected,
            "the lookup of {}",
            hash.to_hex()
        );
    }
    for ((id, expected), answer) in ids.iter().zip(model_answers) {
        assert_eq!(&answer.unwrap(), expected, "the lookup of {id}");
    }
}

/// docs/api.md: a pairing code pairs once, before it expires, a client asking for scopes it
/// grants: the code is used up and the client stored in one transaction; a used or expired
/// code is no code.
pub async fn a_pairing_code_pairs_one_client_once_before_it_expires<F: StoreFactory>(factory: &F) {
    let (store, _listener) = fresh_store(factory).await;
    let (code_pairing, code) = pairing(&[Scope::ResponsesRead, Scope::ResponsesWrite], time(0));
    store.insert_pairing(code_pairing).await.unwrap();
    let (paired, token) = client(&[Scope::ResponsesRead]);
    assert_eq!(
        store
            .redeem_pairing(code.hash(), paired.clone(), time(100))
            .await
            .unwrap(),
        Redemption::Paired
    );
    assert_eq!(
        store.client_by_token_hash(token.hash()).await.unwrap(),
        Some(paired)
    );
    let (again, again_token) = client(&[Scope::ResponsesRead]);
    assert_eq!(
        store
            .redeem_pairing(code.hash(), again, time(200))
            .await
            .unwrap(),
        Redemption::NoSuchCode {
            limit_reached: false
        },
        "one use"
    );
    assert_eq!(
        store
            .client_by_token_hash(again_token.hash())
            .await
            .unwrap(),
        None
    );

    let (expiring, expiring_code) = pairing(&[Scope::ModelsRead], time(0));
    store.insert_pairing(expiring).await.unwrap();
    let (late, late_token) = client(&[Scope::ModelsRead]);
    assert_eq!(
        store
            .redeem_pairing(expiring_code.hash(), late, time(PAIRING_TTL_MILLIS))
            .await
            .unwrap(),
        Redemption::NoSuchCode {
            limit_reached: false
        },
        "expired at ten minutes"
    );
    assert_eq!(
        store.client_by_token_hash(late_token.hash()).await.unwrap(),
        None
    );
}

/// docs/api.md: a code that does not grant every scope a client asks for pairs nothing, stores
/// nothing and is not counted as a wrong code; it stays usable for the scopes it grants.
pub async fn a_code_that_does_not_grant_the_scopes_asked_for_is_kept<F: StoreFactory>(factory: &F) {
    let (store, _listener) = fresh_store(factory).await;
    let (pairing, code) = pairing(&[Scope::ModelsRead], time(0));
    store.insert_pairing(pairing).await.unwrap();
    for _ in 0..lmsp_domain::auth::PAIRING_MAX_FAILURES + 1 {
        let (greedy, greedy_token) = client(&[Scope::ModelsRead, Scope::Admin]);
        assert_eq!(
            store
                .redeem_pairing(code.hash(), greedy, time(10))
                .await
                .unwrap(),
            Redemption::ScopesNotGranted
        );
        assert_eq!(
            store
                .client_by_token_hash(greedy_token.hash())
                .await
                .unwrap(),
            None
        );
    }
    let (modest, token) = client(&[Scope::ModelsRead]);
    assert_eq!(
        store
            .redeem_pairing(code.hash(), modest.clone(), time(20))
            .await
            .unwrap(),
        Redemption::Paired,
        "the code stayed usable and the refusals were not wrong codes"
    );
    assert_eq!(
        store.client_by_token_hash(token.hash()).await.unwrap(),
        Some(modest)
    );
}

/// docs/api.md: the fifth wrong code within ten minutes burns every outstanding code and locks
/// pairing; while locked nothing is tried (not even a good code, which is burnt anyway); ten
/// minutes after the fifth failure pairing opens again with a fresh count.
pub async fn the_fifth_wrong_code_within_ten_minutes_burns_every_code_and_locks_pairing<
    F: StoreFactory,
>(
    factory: &F,
) {
    let (store, _listener) = fresh_store(factory).await;
    let (good, good_code) = pairing(&[Scope::ResponsesRead], time(0));
    store.insert_pairing(good).await.unwrap();
    let wrong = |n: i64| lmsp_domain::auth::Secret::new(format!("000-{n:03}")).hash();
    for n in 0..4 {
        let (guess, _) = client(&[Scope::ResponsesRead]);
        assert_eq!(
            store
                .redeem_pairing(wrong(n), guess, time(1_000 + n))
                .await
                .unwrap(),
            Redemption::NoSuchCode {
                limit_reached: false
            },
            "wrong code {n}"
        );
    }
    let fifth = time(1_004);
    let (guess, _) = client(&[Scope::ResponsesRead]);
    assert_eq!(
        store.redeem_pairing(wrong(4), guess, fifth).await.unwrap(),
        Redemption::NoSuchCode {
            limit_reached: true
        },
        "the fifth makes the limit"
    );
    let until = fifth.plus_millis(PAIRING_TTL_MILLIS);
    let (asker, asker_token) = client(&[Scope::ResponsesRead]);
    assert_eq!(
        store
            .redeem_pairing(good_code.hash(), asker.clone(), time(1_005))
            .await
            .unwrap(),
        Redemption::Locked { until }
    );
    assert_eq!(
        store
            .redeem_pairing(wrong(9), asker.clone(), until.plus_millis(-1))
            .await
            .unwrap(),
        Redemption::Locked { until },
        "locked until the window has passed"
    );
    assert_eq!(
        store
            .client_by_token_hash(asker_token.hash())
            .await
            .unwrap(),
        None
    );
    let (fresh, fresh_code) = pairing(&[Scope::ResponsesRead], until.plus_millis(-5));
    store.insert_pairing(fresh).await.unwrap();
    let (after, after_token) = client(&[Scope::ResponsesRead]);
    assert_eq!(
        store
            .redeem_pairing(good_code.hash(), after, until)
            .await
            .unwrap(),
        Redemption::NoSuchCode {
            limit_reached: false
        },
        "open again, and the outstanding code was burnt"
    );
    assert_eq!(
        store
            .client_by_token_hash(after_token.hash())
            .await
            .unwrap(),
        None
    );
    for n in 0..3 {
        let (guess, _) = client(&[Scope::ResponsesRead]);
        assert_eq!(
            store
                .redeem_pairing(wrong(20 + n), guess, until.plus_millis(1 + n))
                .await
                .unwrap(),
            Redemption::NoSuchCode {
                limit_reached: false
            },
            "a fresh count after the lock"
        );
    }
    let (paired, token) = client(&[Scope::ResponsesRead]);
    assert_eq!(
        store
            .redeem_pairing(fresh_code.hash(), paired.clone(), until.plus_millis(10))
            .await
            .unwrap(),
        Redemption::Paired,
        "a code made during the lock survives it, and works after"
    );
    assert_eq!(
        store.client_by_token_hash(token.hash()).await.unwrap(),
        Some(paired)
    );
}

/// docs/api.md: wrong codes older than ten minutes are forgotten: four old ones and one new one
/// do not make the limit.
pub async fn wrong_codes_older_than_ten_minutes_do_not_count<F: StoreFactory>(factory: &F) {
    let (store, _listener) = fresh_store(factory).await;
    let wrong = |n: i64| lmsp_domain::auth::Secret::new(format!("111-{n:03}")).hash();
    for n in 0..4 {
        let (guess, _) = client(&[Scope::ResponsesRead]);
        store
            .redeem_pairing(wrong(n), guess, time(n))
            .await
            .unwrap();
    }
    let (guess, _) = client(&[Scope::ResponsesRead]);
    assert_eq!(
        store
            .redeem_pairing(wrong(4), guess, time(PAIRING_TTL_MILLIS + 3))
            .await
            .unwrap(),
        Redemption::NoSuchCode {
            limit_reached: false
        }
    );
    let (good, code) = pairing(&[Scope::ResponsesRead], time(PAIRING_TTL_MILLIS + 4));
    store.insert_pairing(good).await.unwrap();
    let (paired, _) = client(&[Scope::ResponsesRead]);
    assert_eq!(
        store
            .redeem_pairing(code.hash(), paired, time(PAIRING_TTL_MILLIS + 5))
            .await
            .unwrap(),
        Redemption::Paired
    );
}

/// The first `initialize` of an empty store stores the candidate identity and the admin client
/// together; a later one changes nothing and answers the stored identity; a store that accepts
/// commits says so.
pub async fn initialize_stores_the_identity_and_the_admin_client_once<F: StoreFactory>(
    factory: &F,
) {
    let (store, _listener) = fresh_store(factory).await;
    let candidate = identity(time(0));
    let (admin, admin_token) = client(&[Scope::Admin]);
    let first = store
        .initialize(candidate.clone(), admin.clone())
        .await
        .unwrap();
    assert!(first.first_start);
    assert_eq!(first.identity, candidate);
    assert_eq!(
        store
            .client_by_token_hash(admin_token.hash())
            .await
            .unwrap(),
        Some(admin.clone())
    );
    let (second_admin, second_token) = client(&[Scope::Admin]);
    let again = store
        .initialize(identity(time(5)), second_admin)
        .await
        .unwrap();
    assert!(!again.first_start);
    assert_eq!(again.identity, candidate, "the identity never changes");
    assert_eq!(
        store
            .client_by_token_hash(second_token.hash())
            .await
            .unwrap(),
        None
    );
    assert_eq!(store.list_clients().await.unwrap(), vec![admin]);
    store.check_writable(time(10)).await.unwrap();
    store.check_writable(time(11)).await.unwrap();
}
